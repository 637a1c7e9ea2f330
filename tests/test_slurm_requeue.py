"""Slurm preemption and requeue through the real code path, with Slurm faked: the job's environment
variables (so Lightning picks its SLURMEnvironment, auto-requeue on) and a stub `scontrol` on PATH
that records its arguments. SIGUSR1 (the time-limit warning) saves at a step boundary, requeues the
job through Lightning's handler and exits resumable; the same command run again as the requeued job
(SLURM_RESTART_COUNT=1) resumes and ends bitwise like an uninterrupted run. SIGTERM saves and exits
without a requeue. Neither interrupted job counts as a finished curriculum stage."""

import json
import os
import signal
import subprocess
import time

import pytest
import torch

from anchormass.curriculum.execute import StageRun
from anchormass.runs.preemption import EXIT_INTERRUPTED
from anchormass.runs.slurm_requeue import requeue, requeue_resume

from _train_helpers import FAST, REPO, model_params, run_train, subprocess_env, train_cmd

STEPS = 8
OVER = ["model=anchormass_tiny", *FAST, f"stage.total_steps={STEPS}", "stage.ckpt_every=2", "stage.val_every=4",
        "stage.global_batch_size=4", "stage.micro_batch_size=2"]  # 2 micro-batches per step: a real boundary
# Slowed from step 2 on by a test hook that does not touch the numbers, so the signal lands mid-run.
SLOW = ["+callbacks.slow._target_=_train_helpers.SleepAfter", "+callbacks.slow.step=2", "+callbacks.slow.seconds=0.7"]
JOB_ID = "4242"


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("slurm") / "ref"
    proc = run_train([f"data_dir={data['pretrain']}", *OVER], out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def fake_slurm(tmp_path, restarts: int = 0) -> tuple[dict, object]:
    """The environment of task 0 of a one-task Slurm job, with a recording `scontrol` first on PATH."""
    bin_dir, record = tmp_path / "fake_slurm_bin", tmp_path / "scontrol_calls.txt"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "scontrol"
    stub.write_text(f'#!/bin/sh\necho "scontrol $*" >> "{record}"\n')
    stub.chmod(0o755)
    env = {**subprocess_env(), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": JOB_ID,
           "SLURM_JOB_NAME": "anchormass-train", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1",
           "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost"}
    if restarts:
        env["SLURM_RESTART_COUNT"] = str(restarts)
    return env, record


def signal_mid_run(cmd, env, out, signum) -> subprocess.CompletedProcess:
    """Start the job, send `signum` once its step-2 checkpoint exists, wait for it to end."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = out / "checkpoints" / "step-0000002.ckpt"
    deadline = time.monotonic() + 120
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the job ended before the signal:\n" + proc.communicate()[1][-3000:]
    proc.send_signal(signum)
    try:
        stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the signalled job did not stop:\n" + proc.communicate()[1][-3000:])
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def step_of(path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["global_step"]


def stage_is_done(out) -> bool:
    return StageRun("tiny", "pretrain", out, None, [], None).is_done()


@pytest.mark.slow
def test_sigusr1_requeues_and_the_requeued_job_resumes_exactly(data, reference, tmp_path):
    out = tmp_path / "job"
    cmd = train_cmd([f"data_dir={data['pretrain']}", *OVER], out)
    env, record = fake_slurm(tmp_path)
    transcript = [f"$ SLURM_JOB_ID={JOB_ID} SLURM_NTASKS=1 PATH=<stub scontrol>:$PATH python train.py ... "
                  f"hydra.run.dir={out.name}   # then SIGUSR1 after step 2"]

    first = signal_mid_run(cmd + SLOW, env, out, signal.SIGUSR1)
    lines = [ln for ln in first.stderr.splitlines() if ln.startswith(("interrupted:", "error:"))]
    transcript += [*lines, f"[exit {first.returncode}]", "$ cat scontrol_calls.txt",
                   *(record.read_text().splitlines() if record.exists() else ["<no scontrol call>"])]
    assert first.returncode == EXIT_INTERRUPTED, first.stderr[-3000:]
    assert record.read_text().splitlines() == [f"scontrol requeue {JOB_ID}"]  # Lightning's requeue, once
    assert len(lines) == 1 and "SIGUSR1 at step" in lines[0] and f"requeued Slurm job {JOB_ID}" in lines[0]
    stopped = step_of(out / "checkpoints" / "last.ckpt")
    assert 2 <= stopped < STEPS
    assert f"Requeued SLURM job: {JOB_ID}" in (out / "train.log").read_text()  # Lightning's handler ran
    assert not list(out.glob("hpc_ckpt_*.ckpt"))  # and its hpc copy of the same step is not kept
    result = json.loads((out / "train_result.json").read_text())
    assert result["completed"] is False and not stage_is_done(out)  # requeued: not done

    # The requeued job: Slurm runs the same command again, SLURM_RESTART_COUNT=1, no ckpt_path.
    env, _ = fake_slurm(tmp_path, restarts=1)
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    transcript += ["$ SLURM_RESTART_COUNT=1 <the same command>   # the requeued job",
                   *[ln for ln in again.stdout.splitlines() if ln.startswith("done:")], f"[exit {again.returncode}]"]
    print("\n" + "\n".join(transcript))
    assert again.returncode == 0, again.stderr[-3000:]
    assert record.read_text().splitlines() == [f"scontrol requeue {JOB_ID}"]  # no second requeue
    last = out / "checkpoints" / "last.ckpt"
    assert step_of(last) == STEPS and stage_is_done(out)
    a, b = model_params(reference / "checkpoints" / "last.ckpt"), model_params(last)
    assert a.keys() == b.keys()
    unequal = [k for k in a if not torch.equal(a[k], b[k])]
    assert not unequal, f"the requeued job's weights differ from the uninterrupted run: {unequal}"
    assert json.loads((out / "train_result.json").read_text())["completed"] is True


@pytest.mark.slow
def test_sigterm_under_slurm_saves_and_exits_without_requeue(data, tmp_path):
    """Preemption or scancel: resumable, but a cancelled job must not bring itself back."""
    out = tmp_path / "job"
    env, record = fake_slurm(tmp_path)
    proc = signal_mid_run(train_cmd([f"data_dir={data['pretrain']}", *OVER, *SLOW], out), env, out, signal.SIGTERM)
    assert proc.returncode == EXIT_INTERRUPTED, proc.stderr[-3000:]
    assert not record.exists()
    assert 2 <= step_of(out / "checkpoints" / "last.ckpt") < STEPS and not stage_is_done(out)


def test_only_a_restarted_slurm_job_with_a_checkpoint_resumes_by_itself(tmp_path, monkeypatch):
    env, _ = fake_slurm(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    cases = [({}, True, None),  # not under Slurm
             ({k: v for k, v in env.items() if k.startswith("SLURM_")}, True, None),  # a fresh job: refused as before
             ({**env, "SLURM_RESTART_COUNT": "1"}, False, None),  # requeued before its first checkpoint: starts
             ({**env, "SLURM_RESTART_COUNT": "1"}, True, "last"),
             ({**env, "SLURM_RESTART_COUNT": "2", "SLURM_JOB_NAME": "interactive"}, True, None)]  # salloc shell
    for variables, with_ckpt, want in cases:
        for key in [k for k in os.environ if k.startswith("SLURM_")]:
            monkeypatch.delenv(key)
        for key, value in variables.items():
            if key.startswith("SLURM_"):
                monkeypatch.setenv(key, value)
        ckpt = tmp_path / "checkpoints" / "step-0000002.ckpt"
        if with_ckpt:
            ckpt.write_bytes(b"")
        else:
            ckpt.unlink(missing_ok=True)
        assert requeue_resume(tmp_path) == want, variables


class _OneRank:
    world_size, is_global_zero = 1, True


def test_requeue_goes_through_the_handler_that_owned_sigusr1(tmp_path, monkeypatch):
    """Under hydra/launcher=slurm submitit's handler owned SIGUSR1: after the save it gets the signal."""
    env, _ = fake_slurm(tmp_path)
    for key, value in env.items():
        if key.startswith("SLURM_"):
            monkeypatch.setenv(key, value)
    calls = []
    assert requeue(_OneRank(), signal.SIGTERM, calls.append) is None and calls == []  # SIGTERM: no requeue
    assert requeue(_OneRank(), signal.SIGUSR1, lambda *a: calls.append(a)) == f"requeued Slurm job {JOB_ID}"
    assert calls == [(signal.SIGUSR1, None)]
    assert requeue(_OneRank(), signal.SIGUSR1, signal.SIG_DFL) is None  # no owner, no Lightning SLURM env
    monkeypatch.delenv("SLURM_NTASKS")  # not under Slurm: nothing to requeue
    assert requeue(_OneRank(), signal.SIGUSR1, lambda *a: calls.append(a)) is None and len(calls) == 1
