"""curriculum=recall_study end to end with tiny step counts and evaluation sizes (slow): every
seed's chain trains, each seed's frontier report is written, and the seeds pool into one report."""

import json
import subprocess
import sys

import pytest

from _train_helpers import REPO, subprocess_env

TINY_STAGES = ["stage.total_steps=2", "stage.val_every=1", "stage.val_batches=1", "stage.ckpt_every=2",
               "stage.warmup_steps=1", "stage.global_batch_size=2", "stage.micro_batch_size=2"]
TINY_EVAL = ("curriculum.eval_overrides=['eval.recall_frontier.lengths=[64,128]',"
             "'eval.recall_frontier.slot_budgets=[8]',"
             "'eval.recall_frontier.slot_policies=[adaptive,fifo]','eval.recall_frontier.kv_policies=[streaming_llm,snapkv]',"
             "'eval.recall_frontier.mqar.n_items=2','eval.recall_frontier.mqar.n_pairs=4',"
             "'eval.recall_frontier.passkey.depths=[0.5]','eval.recall_frontier.passkey.seeds=[0,1]']")


@pytest.mark.slow
def test_recall_study_runs_end_to_end_with_tiny_steps(tmp_path):
    cmd = [sys.executable, str(REPO / "scripts" / "run_curriculum.py"), "curriculum=recall_study",
           f"runs_root={tmp_path}", "curriculum.seeds=[0,1]", "logger=none", TINY_EVAL, *TINY_STAGES]
    proc = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    root = tmp_path / "recall_study"
    summary = json.loads((root / "curriculum.json").read_text())
    assert {(r["seed"], r["model"]) for r in summary["stages"]} == {
        (s, m) for s in (0, 1) for m in ("standard_recall", "anchormass_recall")}
    for seed in (0, 1):
        res = json.loads((root / "report" / "frontier" / f"seed{seed}" / "results.json").read_text())
        rows = res["suites"]["recall_frontier"]["rows"]
        assert {r["length"] for r in rows} == {64, 128} and {r["task"] for r in rows} == {"passkey", "mqar"}
    pooled = (root / "report" / "frontier" / "report.md").read_text()
    assert "mean ± std over 2 training seed(s)" in pooled and "standard/snapkv" in pooled
    assert (root / "report" / "frontier" / "recall_frontier.png").stat().st_size > 0
