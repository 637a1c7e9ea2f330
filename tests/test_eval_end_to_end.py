"""evaluate.py end to end on random-init tiny models with tiny sizes (configs/eval/cpu_tiny.yaml)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from anchormass.data.token_file import write_tokens
from anchormass.data.tokenizer import train_tokenizer
from anchormass.errors import AnchorMassError, ConfigError
from anchormass.eval.items import CLASSIC_EN, CLASSIC_JA, PHRASINGS
from anchormass.eval.runner import run_evaluation

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A small tokenizer, a val.bin made with it, and JCommonsenseQA-format files."""
    d = tmp_path_factory.mktemp("eval_assets")
    texts = [CLASSIC_JA * 3, CLASSIC_EN * 3] + [" ".join(v) for lang in PHRASINGS.values() for v in lang.values()]
    texts += ["質問：答え：選択肢、りんご みかん ぶどう もも なし 0123456789"] * 3
    tok = train_tokenizer(texts, d / "tok.model", vocab_size=600, hard_vocab_limit=False)
    rng = np.random.default_rng(0)
    write_tokens(d / "val.bin", rng.integers(4, tok.vocab_size, size=3000), tok.vocab_size,
                 {"tokenizer_checksum": tok.checksum})
    fruits = ["りんご", "みかん", "ぶどう", "もも", "なし"]
    rows = [{"q_id": i, "question": f"果物{i}は？", **{f"choice{k}": fruits[(i + k) % 5] for k in range(5)},
             "label": i % 5} for i in range(12)]
    for name in ("train-v1.3.json", "valid-v1.3.json"):
        (d / name).write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    return d


VOCAB = 600  # >= the test tokenizer's ids; a 28K-vocab LM head would dominate the runtime


def pair(assets):
    """Model A = anchormass_tiny, B = standard_tiny, both with a small vocabulary (random init)."""
    import yaml

    std = assets / "standard_tiny_small.yaml"
    if not std.exists():
        cfg = yaml.safe_load((ROOT / "configs/model/standard_tiny.yaml").read_text())
        std.write_text(yaml.safe_dump({**cfg, "vocab_size": VOCAB}))
    return ["model=anchormass_tiny", f"model.vocab_size={VOCAB}", f"compare_model={std}"]


def compose_cfg(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(config_name="evaluate", overrides=list(overrides))


def common(assets, out):
    return [f"tokenizer={assets / 'tok.model'}", f"data_dir={assets}", f"eval.jcqa.dir={assets}",
            f"out_dir={out}", "progress=false"]


def test_ppl_and_jcqa_paired_in_process(assets, tmp_path):
    cfg = compose_cfg("suite=[ppl,jcqa]", *pair(assets),
                      *common(assets, tmp_path / "run"))
    out = run_evaluation(cfg)
    res = json.loads((out / "results.json").read_text())
    assert [m["label"] for m in res["models"]] == ["anchormass_tiny", "standard_tiny"]
    assert res["git_commit"] and res["data"]["ppl"]["sha256"]
    ppl = res["suites"]["ppl"]
    assert len(ppl["anchors"]) == 4 and min(ppl["anchors"]) >= 192
    assert len(ppl["items"]) == 2 * 3 * 4 and all(r["test"]["n"] == 4 for r in ppl["rows"])
    jc = res["suites"]["jcqa"]
    assert jc["n_questions"] == 6 and len(jc["correct"]["standard_tiny"]) == 6
    assert "p" in jc["mcnemar"]
    report = (out / "report.md").read_text()
    assert "Long-sequence perplexity" in report and "JCommonsenseQA" in report
    assert (out / "ppl_vs_context.png").stat().st_size > 1000
    assert not list(tmp_path.glob(".*partial*"))


def test_bad_input_leaves_nothing_behind(assets, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="exceeds what model"):
        run_evaluation(compose_cfg("suite=ppl", "model=anchormass_tiny", "eval.ppl.contexts=[0,9000]",
                                   *common(assets, out)))
    with pytest.raises(AnchorMassError, match="not found"):
        run_evaluation(compose_cfg("suite=ppl", "model=anchormass_tiny", *common(assets, out)[:1],
                                   f"data_dir={tmp_path}", f"out_dir={out}"))
    with pytest.raises(ConfigError, match="unknown suite"):
        run_evaluation(compose_cfg("suite=bogus", "model=anchormass_tiny", *common(assets, out)))
    with pytest.raises(ConfigError, match="nothing to evaluate"):
        run_evaluation(compose_cfg("suite=ppl", *common(assets, out)))
    with pytest.raises(ConfigError, match="seed must be an integer, got 'abc'"):
        run_evaluation(compose_cfg("suite=ppl", "model=anchormass_tiny", "seed=abc", *common(assets, out)))
    assert not out.exists() and not list(tmp_path.iterdir())
    out.write_text("")
    with pytest.raises(ConfigError, match="exists and is not a folder"):
        run_evaluation(compose_cfg("suite=ppl", "model=anchormass_tiny", *common(assets, out)))


def test_cli_bad_input_exits_2_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "evaluate.py", "suite=ppl", f"ckpt={tmp_path / 'nope.ckpt'}",
                           f"out_dir={tmp_path / 'out'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: checkpoint not found")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_profile_passkey_policies_in_process(assets, tmp_path):
    cfg = compose_cfg("suite=[profile,passkey,policies]", *pair(assets),
                      "eval.profile.standard_policies=[{policy: streaming_llm, budget: 64}]",
                      *common(assets, tmp_path / "run"))
    out = run_evaluation(cfg)
    res = json.loads((out / "results.json").read_text())["suites"]
    prof = res["profile"]
    assert prof["series"] == ["anchormass_tiny", "standard_tiny", "standard_tiny + streaming_llm@64"]
    rows = {(r["series"], r["length"]): r for r in prof["rows"]}
    # Standard's dense cache grows with the length; its streaming variant does not
    assert rows[("standard_tiny", 256)]["kv_bytes"] > rows[("standard_tiny", 128)]["kv_bytes"]
    assert rows[("standard_tiny + streaming_llm@64", 256)]["kv_bytes"] < rows[("standard_tiny", 256)]["kv_bytes"]
    pk = res["passkey"]
    main = [r for r in pk["items"] if r["phrasing"] == "plain" and r["length"] in (160, 320)]
    assert len(main) == 2 * 2 * 2  # models x lengths x depths x seeds
    assert {r["phrasing"] for r in pk["items"]} == set(PHRASINGS["ja"])
    assert all(r["status"] == "ok" and 0 <= r["digits"] <= 4 for r in pk["items"])
    assert {c["n"] for c in pk["robustness"]["by_phrasing"]["standard_tiny"].values()} == {2}
    # both models saw identical trials
    key = lambda r: (r["length"], r["depth"], r["seed"], r["phrasing"], r["key"])  # noqa: E731
    assert sorted(map(key, (r for r in pk["items"] if r["model"] == "anchormass_tiny"))) == \
        sorted(map(key, (r for r in pk["items"] if r["model"] == "standard_tiny")))
    pol = res["policies"]
    assert pol["labels"] == ["anchormass_tiny"] and len(pol["cells"]) == 2 * 5
    assert all(c["n"] == 2 for c in pol["cells"])
    for png in ("profile.png", "passkey_heatmap.png", "policies.png"):
        assert (out / png).stat().st_size > 1000
    report = (out / "report.md").read_text()
    assert "Format robustness" in report and "Stage-2 policies" in report


def test_mismatched_tokenizer_or_data_is_refused(assets, tmp_path):
    from anchormass.errors import CheckpointError, DataError

    out = tmp_path / "run"
    # tokenizer with more ids than the model's vocabulary
    with pytest.raises(CheckpointError, match="do not match"):
        run_evaluation(compose_cfg("suite=passkey", "model=anchormass_tiny", "model.vocab_size=300",
                                   *common(assets, out)))
    # a token file made with another tokenizer
    other = tmp_path / "other"
    write_tokens(other / "val.bin", np.arange(4, 3000) % 400, 465, {"tokenizer_checksum": "0" * 64})
    with pytest.raises(DataError, match="different tokenizer"):
        run_evaluation(compose_cfg("suite=ppl", *pair(assets), *common(assets, out), f"data_dir={other}"))
    assert not out.exists()


def test_passkey_with_natural_text_filler_from_a_token_file(assets, tmp_path):
    cfg = compose_cfg("suite=passkey", "model=anchormass_tiny", f"model.vocab_size={VOCAB}",
                      "eval.passkey.filler=tokens", f"eval.passkey.filler_path={assets / 'val.bin'}",
                      "eval.passkey.robustness=null", "eval.passkey.lengths=[200]", *common(assets, tmp_path / "r"))
    res = json.loads((run_evaluation(cfg) / "results.json").read_text())
    assert res["suites"]["passkey"]["filler"] == "tokens" and "passkey_filler" in res["data"]
    assert len(res["suites"]["passkey"]["items"]) == 2


def test_checkpoint_trained_with_another_tokenizer_is_refused(assets, tmp_path):
    from types import SimpleNamespace

    from anchormass.errors import CheckpointError
    from anchormass.eval.loading import load_tokenizer
    from anchormass.eval.suite import EvalModel

    config = SimpleNamespace(vocab_size=1 << 16)  # large enough: only the checksum can refuse
    m = EvalModel("m", None, config, "x", {"tokenizer_checksum": "f" * 64})
    with pytest.raises(CheckpointError, match="not the one model 'm' was trained with"):
        load_tokenizer(assets / "tok.model", [m])


def test_full_preset_main_passkey_table_counts_only_the_main_grid(assets, tmp_path):
    """eval=full runs its robustness trials (more seeds) at a main length: the main table of that
    length must still hold depths x seeds trials, the robustness table its own."""
    cfg = compose_cfg("eval=full", "suite=passkey", "model=anchormass_tiny", f"model.vocab_size={VOCAB}",
                      "eval.passkey.lengths=[160,320]", "eval.passkey.depths=[0.1,0.9]", "eval.passkey.seeds=[0]",
                      "eval.passkey.max_new_tokens=2", "eval.passkey.batch_size=4",
                      "eval.passkey.robustness.length=160", "eval.passkey.robustness.seeds=[0,1,2]",
                      "eval.passkey.robustness.phrasings=[plain,memo]", *common(assets, tmp_path / "run"))
    res = json.loads((run_evaluation(cfg) / "results.json").read_text())["suites"]["passkey"]
    per_length = res["by_length"]["anchormass_tiny"]
    assert {L: c["n"] for L, c in per_length.items()} == {"160": 2, "320": 2}
    assert res["heatmap_n"]["anchormass_tiny"] == [[1, 1], [1, 1]]  # length x depth
    by_phrasing = res["robustness"]["by_phrasing"]["anchormass_tiny"]
    assert {p: c["n"] for p, c in by_phrasing.items()} == {"plain": 6, "memo": 6}


def test_results_carry_provenance_checkpoint_hash_versions_and_git_state(assets, tmp_path):
    import hashlib

    import torch

    from anchormass.models import build_model
    from anchormass.models.config import load_model_config
    from anchormass.training.checkpoint import STATE_PREFIX

    cfg = load_model_config("anchormass_tiny").replace(vocab_size=VOCAB)
    torch.manual_seed(0)
    model = build_model(cfg)
    ckpt = tmp_path / "a.ckpt"
    torch.save({"state_dict": {STATE_PREFIX + k: v for k, v in model.state_dict().items()},
                "hyper_parameters": {"model_config": cfg.to_dict()}}, ckpt)
    out = run_evaluation(compose_cfg("suite=ppl", f"ckpt={ckpt}", "eval.ppl.contexts=[0]", "eval.ppl.n_anchors=2",
                                     *common(assets, tmp_path / "run")))
    res = json.loads((out / "results.json").read_text())
    assert res["models"][0]["sha256"] == hashlib.sha256(ckpt.read_bytes()).hexdigest()
    assert set(res["versions"]) == {"python", "torch", "lightning", "numpy", "scipy"}
    assert res["versions"]["torch"] == torch.__version__.split("+")[0] or res["versions"]["torch"] == torch.__version__
    assert set(res["git"]) == {"commit", "dirty", "modified", "untracked_source"}
    assert res["git_commit"].startswith(res["git"]["commit"])
    assert res["models"][0]["sha256"][:16] in (out / "report.md").read_text()


def test_an_untracked_source_file_makes_the_tree_dirty(tmp_path):
    import subprocess

    from anchormass.utils import git_commit, git_state

    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(git + ["init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    subprocess.run(git + ["-C", str(tmp_path), "add", "a.py"], check=True)
    subprocess.run(git + ["-C", str(tmp_path), "commit", "-qm", "a"], check=True)
    assert git_state(tmp_path)["dirty"] is False and not git_commit(tmp_path).endswith("-dirty")
    (tmp_path / "notes.md").write_text("scratch\n")  # not code: stays clean
    assert git_state(tmp_path)["dirty"] is False
    (tmp_path / "b.py").write_text("y = 2\n")
    state = git_state(tmp_path)
    assert state["dirty"] is True and state["untracked_source"] == ["b.py"] and git_commit(tmp_path).endswith("-dirty")
