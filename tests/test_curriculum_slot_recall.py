"""The slot-recall study (curriculum=slot_recall) end to end with tiny step counts and evaluation
sizes (slow): every chain trains, the uptrained model through its short stage, under the seeds it
names; each seed's report scores the models trained under it (a missing optional one left out), and
the seeds pool into one table with learning curves."""

import json
import subprocess
import sys

import pytest

from _train_helpers import REPO, subprocess_env

TINY = ["stage.total_steps=2", "stage.val_every=1", "stage.val_batches=1", "stage.ckpt_every=1",
        "stage.warmup_steps=1", "stage.global_batch_size=2", "stage.micro_batch_size=2", "logger=none",
        "curriculum.seeds=[0,1]"]
ALSO = ("eval.slot_recall.also=[{label: anchormass_faithful_g1, run: anchormass_faithful_g1/slot_recall_512},"
        "{label: anchormass_faithful_up, run: anchormass_faithful_up/slot_recall_512_up, optional: true},"
        "{label: never_trained, run: nowhere/slot_recall_512, optional: true}]")
# the study's models but the tiny_h8 shape (the faithful route is the same code, 2 CPU minutes more)
MODELS = ("curriculum.models=[{name: standard_faithful, model: standard_tiny_h8, stages: [slot_recall_512]},"
          "{name: anchormass_faithful, model: anchormass_tiny_h8, stages: [slot_recall_512]},"
          "{name: anchormass_faithful_g1, model: anchormass_tiny_h8, overrides: ['model.group_size=1'],"
          " stages: [slot_recall_512]},"
          "{name: anchormass_faithful_up, model: anchormass_tiny_h8, stages: [slot_recall_short, slot_recall_512_up],"
          " seeds: [0]}]")
EVAL = f"curriculum.eval_overrides=['eval.slot_recall.n_items=2','eval.slot_recall.curve.n_items=2',\"{ALSO}\"]"


def _run(args, tmp_path):
    cmd = [sys.executable, str(REPO / "scripts" / "run_curriculum.py"), f"runs_root={tmp_path}", *args, *TINY]
    proc = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_slot_recall_study_runs_end_to_end_with_tiny_steps(tmp_path):
    out = _run(["curriculum=slot_recall", MODELS, EVAL], tmp_path)
    assert "slot_recall_short" in out.stdout
    root = tmp_path / "slot_recall"
    labels = ["standard_faithful", "anchormass_faithful", "anchormass_faithful_g1", "anchormass_faithful_up"]
    for seed in (0, 1):
        res = json.loads((root / "report" / "slot_recall" / f"seed{seed}" / "results.json").read_text())
        sr = res["suites"]["slot_recall"]
        assert sr["labels"] == (labels if seed == 0 else labels[:3])  # the uptrained model: seed 0 only
        assert any("never_trained" in x for x in sr["left_out"])
        assert {c["task"] for c in sr["cells"]} == {"kv", "span", "passkey"}
        assert [p["step"] for p in sr["curves"]["anchormass_faithful"]] == [1, 2]
        assert sr["models"]["anchormass_faithful_g1"]["group_size"] == 1
    assert not (root / "seed1" / "anchormass_faithful_up").exists()
    pooled = (root / "report" / "slot_recall" / "report.md").read_text()
    assert "Recall through slots over training seeds" in pooled and "anchormass_faithful_up" in pooled
    assert "(1 seed)" in pooled  # the uptrained model is pooled over its one seed and says so
    assert "no: control < 80%" in pooled  # two steps learn nothing: no cell counts as a result
    assert "recall-free" in pooled  # every rate beside the level guessing among the answer ids reaches
    for png in ("slot_recall_by_model.png", "slot_recall_curves.png"):
        assert (root / "report" / "slot_recall" / png).stat().st_size > 0
