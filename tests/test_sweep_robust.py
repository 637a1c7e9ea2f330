"""Optuna sweeps as users run them (issue 24): the warmup range follows a shortened stage, every
trial validates at its last step (the objective exists whatever val_every is), a trial without an
objective is recorded as failed and the search goes on, a sweep in which none completed ends in
one line, and rerunning the command continues the sweep in new trial folders (its study kept in
the sweep folder, an interrupted trial resumed, new trials drawing new parameters)."""

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
            and "2 earlier trials (2 completed), 1 to go" in again.stderr)
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


def searched(folder) -> tuple:
    overrides = trial_overrides(folder)
    return tuple(overrides[k] for k in ("optim.lr", "optim.warmup_steps", "optim.weight_decay"))


@pytest.mark.slow
def test_an_interrupted_sweep_resumes_its_trial_and_a_rerun_draws_new_parameters(data, tmp_path):
    out = tmp_path / "sweep"
    stop = ["+callbacks.signal._target_=_preempt_helpers.SignalAt", "+callbacks.signal.step=1"]
    first = sweep(out, data, "hydra.sweeper.n_trials=2", *stop)   # SIGTERM in trial 0: it stops at step 2 of 3
    assert first.returncode == 75, first.stderr[-3000:]
    assert json.loads((out / "0" / "train_result.json").read_text())["completed"] is False
    assert (out / "optuna_study.jsonl").is_file()

    again = sweep(out, data, "hydra.sweeper.n_trials=2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "note: trial 0 was interrupted; resuming it" in again.stderr
    results = {t: json.loads((out / t / "train_result.json").read_text()) for t in "01"}
    assert all(r["completed"] and r["global_step"] == 3 for r in results.values())   # trial 0 trained all its steps
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["0", "1"]
    best = yaml.safe_load((out / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(min(r["metrics"]["val/loss"] for r in results.values()))

    more = sweep(out, data, "hydra.sweeper.n_trials=4")   # two more: the sampler's start-up draws go on
    assert more.returncode == 0, more.stderr[-3000:]
    tried = [searched(out / t) for t in "0123"]
    assert len(set(tried)) == 4, tried   # before: trials 2 and 3 repeated trials 0 and 1 exactly


def test_an_interrupted_trial_of_an_older_sweep_folder_is_never_ranked(tmp_path):
    """A sweep folder without the study journal is read from its trial folders: a trial that did
    not train all its steps has no objective (before, its mid-run loss was told as a result)."""
    from anchormass.runs.optuna_search import objective_of

    folder = tmp_path / "0"
    folder.mkdir()
    result = {"metrics": {"val/loss": 1.5}, "global_step": 11, "total_steps": 20, "completed": False}
    (folder / "train_result.json").write_text(json.dumps(result))
    assert objective_of(folder) is None
    (folder / "train_result.json").write_text(json.dumps({**result, "global_step": 20, "completed": True}))
    assert objective_of(folder) == 1.5
