"""kv_frontier `rope_scaling`: past the trained length a row is measured with the project's NTK
scaling (the default) or with plain RoPE (`none`, the model `transformers`' Llama runs there, so
kvpress can be compared there). The choice changes the model only past original_max_len, so it keys
only those rows; kvpress past that length runs the Llama of the chosen scaling."""

import json
import sys

import numpy as np
import pytest
import torch
from _gqa_helpers import gqa_config
from _passkey_helpers import passkey_tokenizer

from anchormass.errors import ConfigError
from anchormass.eval.runner import run_evaluation
from anchormass.eval.suite import EvalModel
from anchormass.eval.suites.kv_frontier import without_rope_scaling
from anchormass.models import build_model
from anchormass.models.rope import ntk_base

TRAINED = 128  # the tiny model's original_max_len: the passkey's 256 tokens lie past it
SUITE = {"lengths": [256], "batch_size": 2, "chunk": 128,
         "passkey": {"lang": "en", "filler": "classic_en", "depths": [0.5], "seeds": [0], "new_tokens": 4},
         "probe": {"length": 96, "seeds": [100]},
         "anchormass": {"shares": [2], "selections": ["retrieval"], "group_sizes": [8], "outliers": [True],
                        "no_outlier_group_sizes": [], "oracle_group_sizes": []},
         "kv_policies": [], "kvpress": {"python": None}}


def _model(original_max_len: int = TRAINED) -> EvalModel:
    torch.manual_seed(0)
    model = build_model(gqa_config("standard", vocab_size=400, original_max_len=original_max_len)).eval()
    return EvalModel("standard_gqa", model, model.cfg, "random-init")


def _run(root, m, tok, **changes):
    cfg = {"suite": "kv_frontier", "out_dir": str(root / "out"), "progress": False,
           "eval": {"kv_frontier": {**SUITE, "work_dir": str(root / "work"), **changes}}}
    return run_evaluation(cfg, models=[m], tokenizer=tok) / "results.json"


@pytest.fixture(scope="module")
def ntk_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("ntk")
    tok = passkey_tokenizer(root)
    m = _model()
    return m, tok, _run(root, m, tok)


def test_plain_rope_changes_the_model_only_past_its_trained_length():
    m = _model()
    ids = torch.randint(0, 400, (1, 256))
    with torch.no_grad():
        short, long = m.model(ids[:, :TRAINED]), m.model(ids)
        without_rope_scaling(m.model, 256)
        assert torch.equal(m.model(ids[:, :TRAINED]), short)
        plain = m.model(ids)
    assert not torch.allclose(plain, long, atol=1e-4)  # past it, NTK stretched RoPE's base
    ref = _model(original_max_len=256).model
    with torch.no_grad():
        assert torch.allclose(ref(ids), plain, atol=1e-6)


def test_rows_past_the_trained_length_are_not_shared_between_scalings(tmp_path, ntk_report):
    m, tok, report = ntk_report
    assert m.model.cfg.original_max_len == TRAINED  # the run gave the model back as it was loaded
    # the refusal names the setting that differs here
    with pytest.raises(ConfigError, match="measured under other settings.*rope_scaling"):
        _run(tmp_path, m, tok, rope_scaling="none", only_finished=True, journal_from=[str(report)])
    got = _run(tmp_path / "plain", m, tok, rope_scaling="none")
    assert m.model.cfg.original_max_len == TRAINED
    assert got.is_file()


def test_rows_within_the_trained_length_are_shared(tmp_path, ntk_report):
    """The same report, on a model trained past 256 + 4 tokens: the scaling does not apply, every row is taken."""
    _, tok, _ = ntk_report
    m = _model(original_max_len=512)
    report = _run(tmp_path / "a", m, tok)
    got = json.loads(_run(tmp_path / "b", m, tok, rope_scaling="none", only_finished=True,
                          journal_from=[str(report)]).read_text())["suites"]["kv_frontier"]
    assert got["settings"]["not_run_yet"] == [] and got["rows"]


@pytest.mark.parametrize("scaling", ["ntk", "none"])
def test_kvpress_past_the_trained_length_runs_the_llama_of_that_scaling(tmp_path, ntk_report, monkeypatch, scaling):
    """Under NTK kvpress gets the Llama whose RoPE base is our session's at the prompts' length (the same
    model there: tests/test_hf_export.py), under `none` the plain one."""
    import anchormass.eval.suites.kv_frontier.peer as peer

    m, tok, _ = ntk_report
    seen = {}

    def runner(python, folder, presses, items, new_tokens, work, tag, threads=1):
        seen.update(json.loads((folder / "config.json").read_text()), tag=tag, threads=threads)
        return {p["label"]: {it["id"]: {"ids": [5] * new_tokens, "kept": 1, "stored_bytes": 100} for it in items}
                for p in presses}

    monkeypatch.setattr(peer, "answer", runner)
    threads = torch.get_num_threads()
    torch.set_num_threads(3)  # not the runner's default of 1
    try:
        _run(tmp_path, m, tok, rope_scaling=scaling,
             kvpress={"python": sys.executable, "presses": [{"press": "KnormPress"}]})
    finally:
        torch.set_num_threads(threads)
    cfg = m.model.cfg
    base = ntk_base(cfg.rope_theta, 256, TRAINED, cfg.head_dim) if scaling == "ntk" else cfg.rope_theta
    assert seen["rope_parameters"] == {"rope_type": "default", "rope_theta": pytest.approx(base)}
    assert base != cfg.rope_theta or scaling == "none"
    assert seen["tag"] == ("L256_llama_ntk256" if scaling == "ntk" else "L256")  # one answers file per model
    assert seen["threads"] == 3  # the runner gets this run's threads


def test_a_missing_journal_report_is_refused_before_any_work(tmp_path, ntk_report):
    m, tok, _ = ntk_report
    with pytest.raises(ConfigError, match="no report at"):
        _run(tmp_path, m, tok, journal_from=[str(tmp_path / "nope.json")])
    assert not (tmp_path / "work" / "rows.jsonl").exists()


def test_an_unknown_scaling_is_refused(tmp_path, ntk_report):
    m, tok, _ = ntk_report
    with pytest.raises(ConfigError, match="rope_scaling"):
        _run(tmp_path, m, tok, rope_scaling="yarn")
    np.testing.assert_equal(m.model.cfg.original_max_len, TRAINED)
