"""Multi-process training tests (slow): SIGKILL + exact resume, DDP on 2 CPU processes, a sweep."""

import csv
import os
import signal
import subprocess
import time

import pytest
import torch

from anchormass.runs.train import train

from _train_helpers import (
    FAST,
    REFERENCE,
    REPO,
    compose_train,
    csv_rows,
    model_params,
    run_train,
    subprocess_env,
    train_cmd,
)

pytestmark = pytest.mark.slow


def _fail(proc) -> str:
    return f"exit {proc.returncode}\n{proc.stderr[-3000:]}"


def test_sigkill_then_resume_is_bitwise_identical(data, reference, tmp_path):
    """The shared reference's run (conftest.py), killed with SIGKILL right after its step-4
    checkpoint appears (slowed down after step 4 by a test hook that does not touch the numbers, so
    the kill lands mid-run), then resumed in-process: the weights and the CSV history are the
    uninterrupted run's."""
    over = [*REFERENCE, f"data_dir={data['pretrain']}"]
    out = tmp_path / "killed"
    hook = ["+callbacks.slow._target_=_train_helpers.SleepAfter", "+callbacks.slow.step=4",
            "+callbacks.slow.seconds=1.0"]
    proc = subprocess.Popen(train_cmd(over + hook, out), cwd=REPO, env=subprocess_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = out / "checkpoints" / "step-0000004.ckpt"
    deadline = time.monotonic() + 240
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # inside the post-step-4 sleep: last.ckpt is being refreshed or done
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    last = out / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 4
    for ckpt in (out / "checkpoints").glob("*.ckpt"):  # a kill mid-write leaves at most a hidden temp file
        torch.load(ckpt, map_location="cpu", weights_only=False)

    assert train(compose_train(over + [f"ckpt_path={last}"], out))["global_step"] == 6
    a, b = model_params(reference / "checkpoints" / "last.ckpt"), model_params(last)
    assert a.keys() == b.keys()
    unequal = [k for k in a if not torch.equal(a[k], b[k])]
    assert not unequal, f"resumed weights differ from the uninterrupted run: {unequal}"
    assert csv_rows(out) == csv_rows(reference)  # what the killed run logged after step 4 is gone


def _losses(metrics_csv) -> list[float]:
    with open(metrics_csv) as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("train/loss")]
    return [float(r["train/loss"]) for r in sorted(rows, key=lambda r: int(r["step"]))]


def test_ddp_two_processes_match_one_process(data, tmp_path):
    """Same global batch (4 x 64): 1 process vs 2 gloo processes x 2 sequences -> same losses."""
    over = ["model=anchormass_tiny", f"data_dir={data['pretrain']}", *FAST, "stage.total_steps=4",
            "stage.ckpt_every=4", "stage.val_every=4", "stage.global_batch_size=4", "stage.micro_batch_size=4",
            "logger=csv", "trainer.log_every_n_steps=1"]
    one = run_train(over, tmp_path / "one")
    assert one.returncode == 0, _fail(one)
    two = run_train(over + ["trainer=ddp_cpu"], tmp_path / "two")
    assert two.returncode == 0, _fail(two)
    l1 = _losses(tmp_path / "one" / "logs" / "metrics.csv")
    l2 = _losses(tmp_path / "two" / "logs" / "metrics.csv")
    assert len(l1) == len(l2) == 4
    torch.testing.assert_close(torch.tensor(l2), torch.tensor(l1), rtol=1e-4, atol=1e-5)
    a, b = model_params(tmp_path / "one" / "checkpoints" / "last.ckpt"), \
        model_params(tmp_path / "two" / "checkpoints" / "last.ckpt")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5)


def test_sweep_runs_each_job_in_its_own_folder(data, tmp_path):
    over = ["-m", "model=standard_tiny", f"data_dir={data['pretrain']}", *FAST, "optim.lr=1e-3,3e-3",
            f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.run([*train_cmd(over, tmp_path)[:-1]], cwd=REPO, env=subprocess_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, _fail(proc)
    results = sorted(tmp_path.glob("*/train_result.json"))
    assert [p.parent.name for p in results] == ["0", "1"]
    lrs = {p.parent.name: (p.parent / ".hydra" / "overrides.yaml").read_text() for p in results}
    assert "optim.lr=0.001" in lrs["0"] and "optim.lr=0.003" in lrs["1"]


def test_cli_bad_input_is_one_line_exit_2(data, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cases = [(train_cmd([f"data_dir={tmp_path / 'missing'}"], tmp_path / "out"), "no prepared data folder"),
             # Hydra's own run folder, with inputs that are fine (a clean clone has no data/demo)
             (train_cmd([f"data_dir={data['pretrain']}"], blocker / "sub"), "not writable")]
    for cmd, fragment in cases:
        proc = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr[-2000:]
        lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
        assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in proc.stderr
