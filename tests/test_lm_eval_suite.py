"""evaluate.py suite=lm_eval: the harness's JCommonsenseQA prompt on local JGLUE-format files,
run on a tiny model through the harness's HFLM backend; metrics in results.json and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from hydra import compose, initialize_config_dir  # noqa: E402

from anchormass.errors import AnchorMassError  # noqa: E402
from anchormass.eval.runner import run_evaluation  # noqa: E402

from _hf_helpers import VOCAB, tiny_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FRUITS = ["りんご", "みかん", "ぶどう", "もも", "なし"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    d = tmp_path_factory.mktemp("lm_eval_assets")
    tok = tiny_tokenizer(d)
    rows = [{"q_id": i, "question": f"果物{i}は何？", **{f"choice{k}": FRUITS[(i + k) % 5] for k in range(5)},
             "label": i % 5} for i in range(8)]
    for name in ("train-v1.3.json", "valid-v1.3.json"):
        (d / name).write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    return d, tok


def _cfg(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose(config_name="evaluate", overrides=list(overrides))


def test_jcqa_local_through_the_harness(assets, tmp_path):
    d, tok = assets
    cfg = _cfg("suite=lm_eval", "tasks=[jcqa_local]", "model=anchormass_tiny", f"model.vocab_size={VOCAB}",
               f"tokenizer={tok}", f"eval.jcqa.dir={d}", "eval.lm_eval.limit=3", f"out_dir={tmp_path / 'run'}",
               "progress=false")
    out = run_evaluation(cfg)
    res = json.loads((out / "results.json").read_text())["suites"]["lm_eval"]
    assert res["n_samples"]["jcqa_local"] == {"original": 8, "effective": 3}
    summary = res["summary"]
    assert set(summary) == {"anchormass_tiny/jcqa_local/acc", "anchormass_tiny/jcqa_local/acc_norm"}
    # 3 questions: every accuracy is a multiple of 1/3
    assert all(abs(3 * v - round(3 * v)) < 1e-9 and 0 <= v <= 1 for v in summary.values())
    assert [it["doc_id"] for it in res["items"]] == [0, 1, 2] and all(len(it["loglik"]) == 5 for it in res["items"])
    assert sum(it["acc"] for it in res["items"]) / 3 == pytest.approx(summary["anchormass_tiny/jcqa_local/acc"])
    assert res["task_configs"]["jcqa_local"]["num_fewshot"] == 3
    assert res["task_configs"]["jcqa_local"]["doc_to_text"].startswith("### 指示")
    report = (out / "report.md").read_text()
    assert "lm-evaluation-harness" in report and "acc_norm" in report and "3 of 8" in report


def test_missing_jcqa_folder_is_one_line(assets, tmp_path):
    d, tok = assets
    cfg = _cfg("suite=lm_eval", "tasks=[jcqa_local]", "model=standard_tiny", f"model.vocab_size={VOCAB}",
               f"tokenizer={tok}", f"eval.jcqa.dir={tmp_path / 'nowhere'}", f"out_dir={tmp_path / 'run'}")
    with pytest.raises(AnchorMassError, match="JCommonsenseQA file not found"):
        run_evaluation(cfg)
    assert not (tmp_path / "run").exists()


def _harness_logliks(lm, specs, limit):
    import lm_eval
    from lm_eval.tasks import TaskManager

    out = lm_eval.simple_evaluate(model=lm, tasks=specs, limit=limit, task_manager=TaskManager(include_defaults=False),
                                  log_samples=True, verbosity="ERROR")
    return [float(r[0][0]) for s in out["samples"]["jcqa_local"] for r in s["resps"]]


@pytest.mark.slow
def test_exported_folders_give_the_harness_the_same_scores(assets, tmp_path):
    """`lm_eval --model hf` on an exported folder scores what suite=lm_eval scores in memory:
    identical for the remote-code folder, within fp32 rounding for the native Llama folder."""
    from lm_eval.models.huggingface import HFLM

    from anchormass.eval.suite import EvalModel
    from anchormass.eval.suites.lm_eval import harness_model
    from anchormass.hf.export import export_checkpoint, load_source
    from anchormass.hf.lm_eval_tasks import task_specs

    from _hf_helpers import tiny_checkpoint

    d, tok = assets
    specs = task_specs(["jcqa_local"], d)
    for preset, tol in (("anchormass_tiny", 0.0), ("standard_tiny", 1e-4)):
        ckpt = tiny_checkpoint(tmp_path / f"{preset}.ckpt", preset, tok, init_std=0.02)
        folder = export_checkpoint(ckpt, tmp_path / preset)
        model, hparams, tokenizer = load_source(ckpt)
        em = EvalModel(label=preset, model=model, config=model.cfg, source=str(ckpt), hparams=hparams)
        ours = _harness_logliks(harness_model(em, tokenizer, "cpu", 8), specs, 2)
        exported = _harness_logliks(HFLM(pretrained=str(folder), trust_remote_code=True, batch_size=8, device="cpu"),
                                    specs, 2)
        assert len(ours) == 10 and len(exported) == 10
        assert max(abs(a - b) for a, b in zip(ours, exported)) <= tol
