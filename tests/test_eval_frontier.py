"""The recall-memory frontier suite: every method on identical items at matched stored bytes, and
the pooling of training seeds (mean ± std, pooled Wilson interval, McNemar over pooled pairs)."""

import json

import numpy as np
import pytest
import torch
from _passkey_helpers import passkey_tokenizer

from anchormass.errors import ConfigError
from anchormass.eval.report import mcnemar_exact, wilson_interval
from anchormass.eval.runner import run_evaluation
from anchormass.eval.suite import EvalContext, EvalModel
from anchormass.eval.suites.frontier import RecallFrontierSuite
from anchormass.models import build_model

CFG = {"lengths": [128], "slot_budgets": [8], "slot_policies": ["adaptive", "fifo"],
       "kv_policies": ["streaming_llm", "h2o", "snapkv"], "batch_size": 3,
       "passkey": {"lang": "en", "filler": "classic_en", "depths": [0.2, 0.8], "seeds": [0], "new_tokens": 4},
       "mqar": {"vocab": {"keys": [8, 100], "values": [100, 200], "noise": [200, 300]}, "n_pairs": 4, "n_items": 2}}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    tok = passkey_tokenizer(tmp_path_factory.mktemp("frontier"))
    torch.manual_seed(0)
    models = [build_model("standard_tiny").eval(), build_model("anchormass_tiny").eval()]
    return tok, [EvalModel(m.cfg.name, m, m.cfg, "random-init") for m in models]


def test_every_method_runs_on_identical_items_at_matched_bytes(tmp_path, assets):
    tok, models = assets
    out = run_evaluation({"suite": "recall_frontier", "out_dir": str(tmp_path / "out"), "progress": False,
                          "eval": {"recall_frontier": CFG}}, models=models, tokenizer=tok)
    res = json.loads((out / "results.json").read_text())["suites"]["recall_frontier"]
    rows = {(r["task"], r["level"], r["method"]): r for r in res["rows"]}
    methods = {"standard/full", "anchormass/full"} | {f"anchormass/{p}" for p in CFG["slot_policies"]} | {
        f"standard/{p}" for p in CFG["kv_policies"]}
    assert {m for _, _, m in rows} == methods
    for task, n in (("passkey", 2), ("mqar", 2 * 4)):
        cell = [r for r in res["rows"] if r["task"] == task]
        assert all(r["n"] == n and len(r["outcomes"]) == n for r in cell)
        assert len({tuple(r["ids"]) for r in cell}) == 1  # identical items for every method
        ref = rows[(task, "8", "anchormass/adaptive")]
        full = rows[(task, "full", "standard/full")]
        assert ref["stored"] < full["stored"]
        for p in CFG["kv_policies"]:
            r = rows[(task, "8", f"standard/{p}")]
            assert r["target"] == ref["stored"]
            if not r["note"]:  # a policy that reached its matched budget stores within 5% of the target
                assert abs(r["stored"] / ref["stored"] - 1) <= 0.05, (task, p, r["stored"], ref["stored"])
    text = (out / "report.md").read_text()
    assert "### 128 tokens" in text and "standard/snapkv" in text
    assert (out / "recall_frontier.png").stat().st_size > 0


def _result(outcomes: dict[str, list[bool]], stored: float = 100.0) -> dict:
    rows = []
    for method, outs in outcomes.items():
        level = "full" if method.endswith("/full") else "8"
        rows.append({"task": "passkey", "length": 64, "level": level, "method": method, "stored": stored,
                     "k": sum(outs), "n": len(outs), "rate": sum(outs) / len(outs), "outcomes": outs,
                     "ids": [f"i{i}" for i in range(len(outs))], "note": None})
    settings = {"lengths": [64], "reference_policy": "adaptive", "standard_bytes_per_token": 8, "passkey_trials": 4,
                "mqar": {"n_items": 0, "n_queries": 0, "n_pairs": 0, "alpha": 0.0}}
    return {"settings": settings, "rows": rows}


def test_seeds_pool_into_mean_std_wilson_and_mcnemar():
    seed0 = _result({"anchormass/adaptive": [True, True, True, False],
                     "standard/snapkv": [False, True, False, False]})
    seed1 = _result({"anchormass/adaptive": [True, True, False, False],
                     "standard/snapkv": [False, False, False, False]})
    agg = RecallFrontierSuite.aggregate([seed0, seed1], [0, 1])
    rows = {r["method"]: r for r in agg["json"]["rows"]}
    am, snap = rows["anchormass/adaptive"], rows["standard/snapkv"]
    assert (am["k"], am["n"]) == (5, 8) and am["mean"] == pytest.approx(0.625)
    assert am["std"] == pytest.approx(np.std([0.75, 0.5], ddof=1))
    assert am["ci"] == list(wilson_interval(5, 8))
    # pairs are (seed, item): seed 1's items are not seed 0's
    a = [True, True, True, False, True, True, False, False]
    b = [False, True, False, False, False, False, False, False]
    assert snap["mcnemar_vs_anchormass"] == mcnemar_exact(a, b)
    assert "mcnemar_vs_anchormass" not in am
    assert "62.5 ± 17.7%" in agg["markdown"]


def test_one_model_or_bad_policy_is_refused(assets):
    tok, models = assets
    ctx = EvalContext(models=models[:1], tokenizer=tok, device=torch.device("cpu"), progress=False)
    with pytest.raises(ConfigError, match="compares a Standard and an AnchorMass"):
        RecallFrontierSuite(CFG).check(ctx)
    ctx.models = models
    with pytest.raises(ConfigError, match="slot_policies"):
        RecallFrontierSuite({**CFG, "slot_policies": ["nope"]}).check(ctx)
