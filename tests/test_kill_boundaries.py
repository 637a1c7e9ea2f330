"""Every kill is resumable (issue 46): a stage killed between any two files it writes resumes on
rerun and ends with the weights of a run never killed, and a stop signal at any step, the last
included, ends the run resumable (exit 75) after its save. The killed runs are forked from this
process (no new interpreter per kill), each dying with os._exit right after its k-th write."""

import itertools
import json
import os
import signal
from types import SimpleNamespace

import pytest
import torch

from anchormass import utils
from anchormass.curriculum import execute as curriculum
from anchormass.curriculum.execute import StageRun, execute
from anchormass.own_files import recorded
from anchormass.runs import optuna_search, run_dir
from anchormass.runs.layout import finished_run
from anchormass.runs.preemption import TrainingInterrupted
from anchormass.runs.stage_console import StageConsole
from anchormass.runs.train import train
from anchormass.training import checkpoint

from _train_helpers import FAST, compose_train, model_params

# 2 optimizer steps, a checkpoint at each (the killed runs); of 2 micro-batches each (the signalled
# run: its signal lands mid-accumulation), validated at each.
KILLED_RUN = ["model=anchormass_tiny", *FAST, "stage.ckpt_every=1"]
TINY = [*KILLED_RUN, "stage.global_batch_size=4", "stage.val_every=1"]


def signal_hook(step: int) -> list[str]:
    return ["+callbacks.signal._target_=_preempt_helpers.SignalAt", f"+callbacks.signal.step={step}"]


@pytest.mark.parametrize("signal_step", [0, 1])   # in the middle of step 1, of step 2 (the last)
def test_sigterm_at_any_step_saves_and_exits_resumable(signal_step, data, tmp_path):
    """The last step included: before, PreemptCheckpoint returned early at max_steps and never
    looked at the flag, so the run exited 0 and a sweep trained its remaining trials."""
    over = [*TINY, f"data_dir={data['pretrain']}"]
    last = signal_step + 1 == 2
    want = (r"^SIGTERM during the last step \(2\); the stage finished" if last
            else r"^SIGTERM at step 1; saved .*last.ckpt; resume with ckpt_path=last")
    with pytest.raises(TrainingInterrupted, match=want):
        train(compose_train(over + signal_hook(signal_step), tmp_path))
    result = json.loads((tmp_path / "train_result.json").read_text())
    assert (result["completed"], result["global_step"]) == (last, signal_step + 1)
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == signal_step + 1
    assert finished_run(tmp_path) == last   # the curriculum's rerun skips a finished stage
    again = train(compose_train(over + ["ckpt_path=last"], tmp_path))   # what a sweep's rerun does
    assert again["completed"] and again["global_step"] == 2
    if last:
        assert again["metrics"]["val/loss"] == result["metrics"]["val/loss"] > 0


KILLED = 137  # the child's exit code at its boundary, as a SIGKILLed process's shell reports it


def killed_at_boundary(k: int, cfg) -> bool:
    """Train `cfg` in a forked child that dies (os._exit: no cleanup, no handler) at its k-th write
    boundary: before or after the rename of each atomic write, after each record of the names it
    writes (the run folder's outputs, each checkpoint's). False when the run has fewer than k
    boundaries (it finished)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            seen = itertools.count(1)

            def boundary() -> None:
                if next(seen) == k:
                    os._exit(KILLED)

            commit, record = utils.AtomicFile.commit, getattr(checkpoint, "record", lambda *args: None)

            def commit_at_boundaries(self) -> None:
                boundary()   # the temp file written, not renamed
                commit(self)
                boundary()   # the file in place

            def record_then_boundary(folder, names) -> None:
                before = recorded(folder)
                record(folder, names)
                if recorded(folder) != before:   # a name already recorded writes nothing
                    boundary()

            utils.AtomicFile.commit = commit_at_boundaries
            checkpoint.record = run_dir.record = record_then_boundary
            train(cfg)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, KILLED), f"the run failed on its own at boundary {k} (exit {code})"
    return code == KILLED


@pytest.mark.slow  # a forked training run per write boundary (14) and its resume: 17-30 s on 2 cores
def test_a_stage_killed_at_any_write_boundary_resumes_on_rerun(data, tmp_path):
    """Item 3 among them: killed between its first step-N.ckpt and its first last.ckpt, a stage was
    restarted by the curriculum (no last.ckpt) and refused for "another run's checkpoints"."""
    over = [*KILLED_RUN, f"data_dir={data['pretrain']}"]
    train(compose_train(over, tmp_path / "whole"))
    want = model_params(tmp_path / "whole" / "checkpoints" / "last.ckpt")
    kills = 0
    for k in itertools.count(1):
        out = tmp_path / f"killed_at_{k}"
        if not killed_at_boundary(k, compose_train(over, out)):
            break
        kills += 1
        if not finished_run(out):   # the curriculum's rerun: what its command resumes or starts from
            rerun = [a for a in curriculum.command(StageRun("anchormass_tiny", "tiny", out, None, []))
                     if a.startswith(("ckpt_path=", "init_from="))]
            assert train(compose_train(over + rerun, out))["completed"], k
        assert finished_run(out), k
        got = model_params(out / "checkpoints" / "last.ckpt")
        assert all(torch.equal(want[name], got[name]) for name in want), f"killed at boundary {k}: other weights"
        assert not list((out / "checkpoints").glob(".*.tmp")), k   # a killed write's temp file is gone
    # 14: the run folder's record of its outputs; per step, step-N.ckpt and last.ckpt (a name's first
    # record, its temp file, the file); then train_result.json (its temp file, the file)
    assert kills == 14


def test_a_stage_killed_by_a_signal_ends_the_runner_with_a_documented_code(monkeypatch, tmp_path):
    """Before: the child's -9 became SystemExit(-9), exit 247."""
    run = StageRun("m", "a", tmp_path / "a", None, ["stage=pretrain_1k"])
    monkeypatch.setattr(curriculum, "run_logged", lambda cmd, log_path, echo=None: -signal.SIGKILL)
    with open(tmp_path / "console.txt", "w") as stream, pytest.raises(SystemExit) as exit_:
        execute([run], console=StageConsole(verbose=0, stream=stream))
    assert exit_.value.code == 1
    assert "killed by SIGKILL after" in (tmp_path / "console.txt").read_text()


def test_a_sweep_resumes_a_trial_killed_before_its_first_last_ckpt(tmp_path):
    """Before: a trial folder with step-N.ckpt and no last.ckpt was recorded as failed."""
    import optuna

    with optuna_search.quiet_optuna():
        study = optuna.create_study()
    study.ask().set_user_attr("folder", "0")
    trial = tmp_path / "0"
    (trial / ".hydra").mkdir(parents=True)
    (trial / ".hydra" / "overrides.yaml").write_text("- optim.lr=0.001\n")
    (trial / "checkpoints").mkdir()
    torch.save({"global_step": 1}, trial / "checkpoints" / "step-0000001.ckpt")
    launched = []

    def launch(jobs, initial_job_idx):   # the resumed trial trains to its end
        launched.append((jobs[0], initial_job_idx))
        (trial / "train_result.json").write_text(json.dumps({"completed": True, "metrics": {"val/loss": 1.25}}))
        return [SimpleNamespace(return_value=1.25)]

    optuna_search.resume_interrupted(SimpleNamespace(launcher=SimpleNamespace(launch=launch)), study, tmp_path)
    assert launched == [(["optim.lr=0.001", "ckpt_path=last"], 0)]
    assert study.trials[0].state == optuna.trial.TrialState.COMPLETE and study.trials[0].value == 1.25
