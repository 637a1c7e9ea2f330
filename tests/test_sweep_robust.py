"""Optuna sweeps as users run them (issue 24): the warmup range follows a shortened stage, every
trial validates at its last step (the objective exists whatever val_every is), a trial without an
objective is recorded as failed and the search goes on, a sweep in which none completed ends in
one line, and rerunning the command continues the sweep in new trial folders."""

import json
import subprocess
import sys

import pytest
import yaml

from _train_helpers import FAST, REPO, subprocess_env


def sweep(sweep_dir, data, *extra) -> subprocess.CompletedProcess:
    # 3 steps with validation every 2: before, Lightning's last validation was at step 2 only
    # when val_every divided the run, and warmup was searched up to the preset's 1,000 steps.
    args = ["-m", "hydra/sweeper=optuna_optim", f"hydra.sweep.dir={sweep_dir}", f"data_dir={data['pretrain']}",
            *FAST, "stage.total_steps=3", "stage.val_every=2", "stage.warmup_steps=1000", *extra]
    return subprocess.run([sys.executable, str(REPO / "train.py"), *args], cwd=REPO, env=subprocess_env(),
                          capture_output=True, text=True, timeout=600)


def trial_overrides(folder) -> dict:
    return dict(o.split("=", 1) for o in yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()))


@pytest.mark.slow
def test_a_sweep_of_a_shortened_stage_then_its_continuation(data, tmp_path):
    out = tmp_path / "sweep"
    first = sweep(out, data, "hydra.sweeper.n_trials=2")
    assert first.returncode == 0, first.stderr[-3000:]
    for trial in ("0", "1"):
        result = json.loads((out / trial / "train_result.json").read_text())
        assert result["global_step"] == 3 and result["metrics"]["val/loss"] > 0   # validated at step 3
        assert 0 <= int(trial_overrides(out / trial)["optim.warmup_steps"]) <= 3  # capped at the stage
    best = yaml.safe_load((out / "optimization_results.yaml").read_text())

    again = sweep(out, data, "hydra.sweeper.n_trials=3")   # the same command, one more trial wanted
    assert again.returncode == 0, again.stderr[-3000:]
    assert ("note: continuing the sweep" in again.stderr
            and "2 earlier trials (2 told to Optuna), 1 to go" in again.stderr)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["0", "1", "2"]   # a new folder, none reused
    assert json.loads((out / "2" / "train_result.json").read_text())["metrics"]["val/loss"] > 0
    values = {t: json.loads((out / t / "train_result.json").read_text())["metrics"]["val/loss"] for t in "012"}
    after = yaml.safe_load((out / "optimization_results.yaml").read_text())
    assert after["best_value"] == pytest.approx(min(values.values()))  # the earlier trials took part
    assert after["best_value"] <= best["best_value"] + 1e-9


@pytest.mark.slow
def test_trials_without_an_objective_fail_alone_and_an_empty_sweep_is_one_line(data, tmp_path):
    out = tmp_path / "sweep"
    proc = sweep(out, data, "hydra.sweeper.n_trials=2", "stage.val_batches=0")   # no validation: no objective
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["0", "1"]      # the second trial still ran
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "No trials are completed yet" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [
        f"error: no trial of the sweep in {out} completed; each trial's log is {out}/<trial>/train.log"]
