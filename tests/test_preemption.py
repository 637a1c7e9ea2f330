"""Preemption (anchormass/runs/preemption.py): SIGTERM / SIGUSR1 save a resumable checkpoint at
the next optimizer-step boundary and exit 75; the curriculum passes stop signals on to its stages,
never starts a stage from an unfinished one, and one curriculum folder has one runner at a time.
A real SIGTERM to a running curriculum and its resume are in tests/test_curriculum_end_to_end.py."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment

from anchormass.curriculum import execute as curriculum
from anchormass.curriculum.execute import LOCK_FILE_NAME, StageRun, execute
from anchormass.dir_lock import DirLock
from anchormass.runs import logged_process
from anchormass.runs.preemption import EXIT_INTERRUPTED, TrainingInterrupted, forward_stop_signals, preempt_signals
from anchormass.runs.stage_console import StageConsole
from anchormass.runs.train import train

from _train_helpers import REFERENCE, REPO, compose_train, model_params, run_train, subprocess_env, train_cmd
from test_train_curriculum import curriculum_cmd, tiny_curriculum

# The shared reference run's settings (conftest.py's `reference`): 6 optimizer steps of 2
# micro-batches (a stop signal lands mid-accumulation), validation and periodic checkpoints every 2.
OVER = REFERENCE


def reference_weights(reference) -> dict:
    return model_params(reference / "checkpoints" / "last.ckpt")


def signal_hook(step: int, name: str) -> list[str]:
    return ["+callbacks.signal._target_=_preempt_helpers.SignalAt", f"+callbacks.signal.step={step}",
            f"+callbacks.signal.signal_name={name}"]


def test_preempt_signals_take_sigusr1_under_lightnings_slurm_requeue_too():
    """Lightning's SLURM handler would save mid-step from the signal; ours saves at the boundary and
    then requeues through it (runs/slurm_requeue.py, tests/test_slurm_requeue.py)."""
    plain = SimpleNamespace(_accelerator_connector=SimpleNamespace(cluster_environment=LightningEnvironment()))
    slurm = SimpleNamespace(_accelerator_connector=SimpleNamespace(cluster_environment=SLURMEnvironment()))
    assert preempt_signals(plain) == preempt_signals(slurm) == preempt_signals() == (signal.SIGTERM, signal.SIGUSR1)


@pytest.mark.parametrize("name, signal_step, stop_step", [
    ("SIGTERM", 2, 3),  # stops between periodic checkpoints: last.ckpt written by the stop
    ("SIGUSR1", 3, 4),  # stops at a validation and periodic-checkpoint step: that one is written too
])
def test_signal_mid_step_saves_at_the_boundary_and_the_resume_is_bitwise_exact(
        name, signal_step, stop_step, data, reference, tmp_path):
    before = signal.getsignal(getattr(signal, name))
    over = [*OVER, f"data_dir={data['pretrain']}"]
    with pytest.raises(TrainingInterrupted) as stop:
        train(compose_train(over + signal_hook(signal_step, name), tmp_path))
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert str(stop.value) == f"{name} at step {stop_step}; saved {last}; resume with ckpt_path=last"
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == stop_step
    assert (tmp_path / "checkpoints" / "step-0000004.ckpt").exists() == (stop_step == 4)
    result = json.loads((tmp_path / "train_result.json").read_text())
    assert (result["completed"], result["global_step"], result["total_steps"]) == (False, stop_step, 6)
    run = StageRun("anchormass_tiny", "pretrain_1k", tmp_path, None)
    assert not run.is_done()
    assert signal.getsignal(getattr(signal, name)) == before  # the run's handler is gone with it

    done = train(compose_train(over + ["ckpt_path=last"], tmp_path))
    assert done["global_step"] == 6 and json.loads((tmp_path / "train_result.json").read_text())["completed"]
    assert run.is_done()
    resumed, want = model_params(last), reference_weights(reference)
    unequal = [k for k in want if not torch.equal(want[k], resumed[k])]
    assert not unequal, f"resumed weights differ from the uninterrupted run: {unequal}"


def test_train_py_exits_resumable_with_one_line(data, tmp_path):
    proc = run_train([*OVER, f"data_dir={data['pretrain']}", *signal_hook(1, "SIGTERM")], tmp_path)
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert proc.returncode == EXIT_INTERRUPTED == 75, proc.stderr[-3000:]
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert lines == [f"interrupted: SIGTERM at step 2; saved {last}; resume with ckpt_path=last"]
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 2


# -- the curriculum, without processes: what it starts after a stage that did not finish


def _stage(tmp_path: Path, name: str, parent: StageRun | None = None) -> StageRun:
    return StageRun("m", name, tmp_path / name, parent.last_ckpt if parent else None, [f"stage={name}"])


def _write_result(run: StageRun, step: int, total: int, completed: bool | None) -> None:
    (run.out_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    run.last_ckpt.write_bytes(b"")
    res = {"global_step": step, "total_steps": total, "metrics": {}}
    if completed is not None:
        res["completed"] = completed
    (run.out_dir / "train_result.json").write_text(json.dumps(res))


def test_a_stage_is_done_only_when_its_result_says_completed(tmp_path):
    run = _stage(tmp_path, "a")
    for step, completed, done in [(6, True, True), (6, False, False), (6, None, False), (4, True, False)]:
        _write_result(run, step, 6, completed)
        assert run.is_done() is done, (step, completed)


def _fake_stages(monkeypatch, outcomes: dict[str, tuple[int, bool]]) -> list[str]:
    """run_logged stand-in: stage name -> (exit code, completed); returns the stages started."""
    started = []

    def fake(cmd, log_path, echo=None):
        name = next(a.split("=", 1)[1] for a in cmd if a.startswith("stage="))
        started.append(name)
        rc, completed = outcomes[name]
        _write_result(StageRun("m", name, Path(log_path).parent, None), 6 if completed else 3, 6, completed)
        return rc

    monkeypatch.setattr(curriculum, "run_logged", fake)
    return started


def test_a_stage_that_exits_0_unfinished_never_feeds_the_next(monkeypatch, tmp_path):
    a = _stage(tmp_path, "a")
    b = _stage(tmp_path, "b", a)
    started = _fake_stages(monkeypatch, {"a": (0, False), "b": (0, True)})
    with pytest.raises(SystemExit) as exit_:
        execute([a, b], console=StageConsole(verbose=0, stream=open(os.devnull, "w")))
    assert exit_.value.code == 1 and started == ["a"]


def test_an_interrupted_stage_stops_its_chain_and_the_curriculum_is_resumable(monkeypatch, tmp_path):
    a = _stage(tmp_path, "a")
    b = _stage(tmp_path, "b", a)
    started = _fake_stages(monkeypatch, {"a": (EXIT_INTERRUPTED, False), "b": (0, True)})
    out = tmp_path / "console.txt"
    with open(out, "w") as stream, pytest.raises(TrainingInterrupted, match="rerun the same command to resume"):
        execute([a, b], console=StageConsole(verbose=0, stream=stream))
    assert started == ["a"] and not a.is_done()
    assert "a  interrupted at step 3/6, saved" in out.read_text()  # shown even at verbose=0


def test_stop_signals_reach_the_children_and_only_while_inside(tmp_path):
    """SIGINT to the runner: its child gets SIGTERM (a child's SIGINT would be Lightning's
    KeyboardInterrupt, no checkpoint); no new child is left running; handlers come back."""
    child = ("import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda s, f: sys.exit(75))\n"
             "print('ready', flush=True)\n"
             "time.sleep(60)\n")
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    codes = []
    ready = threading.Event()
    try:
        with forward_stop_signals():
            worker = threading.Thread(target=lambda: codes.append(logged_process.run_logged(
                [sys.executable, "-c", child], tmp_path / "child.log", echo=lambda line: ready.set())))
            worker.start()
            assert ready.wait(30)
            os.kill(os.getpid(), signal.SIGINT)
            worker.join(30)
            assert logged_process.stop_requested() == signal.SIGINT
            # a child started after the stop gets the signal at once
            late = logged_process.run_logged([sys.executable, "-c", child], tmp_path / "late.log")
    finally:
        logged_process.clear_stop()
    assert codes == [75] and late in (75, -signal.SIGTERM)
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_runner_going_down_stops_its_running_stages_first(monkeypatch, tmp_path):
    """Whatever ends the runner's main thread (here a KeyboardInterrupt outside forward_stop_signals),
    its stages get SIGTERM and save, instead of training on for hours while it waits for them."""
    child = "import time\nprint('started', flush=True)\ntime.sleep(120)\n"
    monkeypatch.setattr(curriculum, "command", lambda run: [sys.executable, "-c", child])

    class Dies(StageConsole):
        def follow(self, futures):
            self.events.get(timeout=30)  # the stage has started
            raise KeyboardInterrupt

    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            execute([_stage(tmp_path, "a")], console=Dies(verbose=0, stream=open(os.devnull, "w")))
    finally:
        logged_process.clear_stop()
    assert time.monotonic() - t0 < 60  # not the child's 120 s


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


def test_a_second_curriculum_on_the_same_folder_is_refused_before_it_writes(tmp_path):
    cur = tiny_curriculum(tmp_path, ["anchormass_tiny"], [("pretrain_1k", None, 32)])
    root = tmp_path / "runs" / "t"
    finished = root / "anchormass_tiny" / "pretrain_1k"
    (finished / "checkpoints").mkdir(parents=True)
    (finished / "train.log").write_text("the first runner's log\n")
    with DirLock(root / LOCK_FILE_NAME, what="held by the test"):  # the first runner: this process
        before = _tree(tmp_path)
        proc = subprocess.run([*curriculum_cmd(tmp_path, cur), "evaluate=false"], cwd=REPO, env=subprocess_env(),
                              capture_output=True, text=True, timeout=300)
        assert _tree(tmp_path) == before  # no data prepared, no stage touched, no log appended
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(
        f"error: curriculum folder {root} is in use by another process (pid {os.getpid()} on ")
    assert not (root / LOCK_FILE_NAME).exists()  # released by its holder; the refused run left none


# -- end to end, with signals from outside


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"{path} never appeared (exit {proc.poll()})"


SLOW_AFTER = ["+callbacks.slow._target_=_train_helpers.SleepAfter", "+callbacks.slow.step=2",
              "+callbacks.slow.seconds=1.0"]


@pytest.mark.slow
def test_sigterm_from_outside_then_resume_is_bitwise_identical(data, reference, tmp_path):
    """As a scheduler does it: the signal comes from another process, at any moment of a step."""
    over = [*OVER, f"data_dir={data['pretrain']}"]
    proc = subprocess.Popen(train_cmd(over + SLOW_AFTER, tmp_path), cwd=REPO,
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(tmp_path / "checkpoints" / "step-0000002.ckpt", proc)  # then a second per step: mid-run
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_INTERRUPTED, err[-3000:]
    step = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]
    assert err.strip().splitlines()[-1].startswith(f"interrupted: SIGTERM at step {step}; saved ")
    assert step < 6 and not json.loads((tmp_path / "train_result.json").read_text())["completed"]
    assert train(compose_train(over + ["ckpt_path=last"], tmp_path))["global_step"] == 6  # in-process: no signal
    weights, want = model_params(tmp_path / "checkpoints" / "last.ckpt"), reference_weights(reference)
    assert all(torch.equal(want[k], weights[k]) for k in want)


def test_a_stage_ends_with_its_runner_even_on_sigkill(tmp_path):
    """A runner killed with SIGKILL cannot forward anything, and its children run in their own
    process group: each child asks the kernel for SIGTERM when the runner dies (follow_parent)."""
    import os
    import signal as _signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "child.pid"
    child = ("from anchormass.runs.logged_process import follow_parent; follow_parent(); "
             f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)")
    runner = ("import sys; from anchormass.runs.logged_process import run_logged; "
              f"run_logged([sys.executable, '-c', {child!r}], {str(tmp_path / 'child.log')!r})")
    proc = subprocess.Popen([sys.executable, "-c", runner])
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        child_pid = int(pid_file.read_text())
        proc.send_signal(_signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.kill(child_pid, 0)
            except ProcessLookupError:
                break
            # a zombie is gone for this purpose: it was reparented to init, which reaps it
            if open(f"/proc/{child_pid}/stat").read().split()[2] == "Z":
                break
            time.sleep(0.1)
        else:
            os.kill(child_pid, _signal.SIGKILL)
            raise AssertionError("the child kept running after its runner was killed")
    finally:
        if proc.poll() is None:
            proc.kill()
