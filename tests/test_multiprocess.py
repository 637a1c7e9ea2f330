"""DDP over 2 CPU processes started as 2 nodes (trainer.num_nodes=2, one train.py each, rendezvous on
localhost through MASTER_ADDR / MASTER_PORT / NODE_RANK, as on two machines sharing a filesystem):
the same loss curve as one process at the same global batch, and a SIGKILL of one rank followed by
a resume of both ends bitwise where the uninterrupted run ends."""

import csv
import os
import signal
import socket
import subprocess
import time

import pytest
import torch

from _train_helpers import FAST, REPO, model_params, subprocess_env, train_cmd

pytestmark = pytest.mark.slow

STEPS = 8
# Global batch 4 x 64 tokens: one process takes all 4 sequences per step, each node 2 of them.
OVER = ["model=anchormass_tiny", *FAST, f"stage.total_steps={STEPS}", "stage.ckpt_every=4", "stage.val_every=4",
        "stage.global_batch_size=4", "stage.micro_batch_size=4", "logger=csv", "trainer.log_every_n_steps=1"]
# A rank that hangs fails the others after 30 s instead of torch's 30 min (the test never hangs CI).
NODES = ["trainer=ddp_cpu", "trainer.num_nodes=2", "trainer.devices=1", "trainer.strategy.timeout.seconds=30"]
RUN_TIMEOUT = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_nodes(over: list[str], out, nodes: int = 2, tag: str = "run") -> list[subprocess.Popen]:
    """One train.py per node, all into the same run folder; each one's output goes to
    <out>.<tag>.rank<r>.log beside it."""
    port = free_port()
    procs = []
    for rank in range(nodes):
        env = {**subprocess_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NODE_RANK": str(rank),
               "WORLD_SIZE": str(nodes)}
        log = open(out.parent / f"{out.name}.{tag}.rank{rank}.log", "w")
        procs.append(subprocess.Popen(train_cmd(over, out), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
        log.close()
    return procs


def wait_all(procs, timeout: float = RUN_TIMEOUT) -> list[int]:
    """Exit codes; every process still running at the deadline is killed (and the test fails)."""
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        pytest.fail(f"a node did not finish within {timeout} s")


def logs(out) -> str:
    return "\n".join(p.read_text()[-2000:] for p in sorted(out.parent.glob(f"{out.name}.*.rank*.log")))


def losses(out) -> list[float]:
    with open(out / "logs" / "metrics.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r.get("train/loss")]
    return [float(r["train/loss"]) for r in sorted(rows, key=lambda r: int(r["step"]))]


@pytest.fixture(scope="module")
def two_nodes(data, tmp_path_factory):
    """The uninterrupted 2-node run both tests compare against."""
    out = tmp_path_factory.mktemp("ddp") / "two_nodes"
    codes = wait_all(launch_nodes([f"data_dir={data['pretrain']}", *OVER, *NODES], out))
    assert codes == [0, 0], logs(out)
    return out


def test_two_nodes_match_one_process(data, two_nodes, tmp_path):
    out = tmp_path / "one"
    proc = subprocess.run(train_cmd([f"data_dir={data['pretrain']}", *OVER], out), cwd=REPO, env=subprocess_env(),
                          capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = torch.tensor(losses(out), dtype=torch.float64), torch.tensor(losses(two_nodes), dtype=torch.float64)
    assert len(one) == len(two) == STEPS
    diff = (two - one).abs()
    print(f"\nDDP 2 nodes vs 1 process, {STEPS} steps: max |dloss| = {diff.max():.3g}, "
          f"max relative = {(diff / one.abs()).max():.3g}")
    # The same samples and the same math; only float summation order differs (each rank's mean over
    # half the batch, then gloo's all-reduce of gradients and of the logged loss, vs one mean over
    # all of it), a few fp32 ulps per step that Adam carries forward: measured ~1e-7 relative.
    torch.testing.assert_close(two, one, rtol=1e-5, atol=1e-5)
    assert not torch.equal(one, torch.roll(one, 1))  # a curve that moves, not a constant
    a, b = model_params(out / "checkpoints" / "last.ckpt"), model_params(two_nodes / "checkpoints" / "last.ckpt")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5)
    # Rank 0 alone wrote the results, into the one shared run folder, and released its claim.
    assert (two_nodes / "train_result.json").is_file() and not (two_nodes / ".run.lock").exists()


def test_kill_one_rank_then_resume_both_matches_uninterrupted(data, two_nodes, tmp_path):
    out = tmp_path / "killed"
    # Slowed after step 4 by a test hook that does not touch the numbers, so the kill lands mid-run.
    hook = ["+callbacks.slow._target_=_train_helpers.SleepAfter", "+callbacks.slow.step=4",
            "+callbacks.slow.seconds=1.0"]
    over = [f"data_dir={data['pretrain']}", *OVER, *NODES]
    procs = launch_nodes(over + hook, out)
    ckpt = out / "checkpoints" / "step-0000004.ckpt"
    deadline = time.monotonic() + RUN_TIMEOUT
    while not ckpt.exists() and all(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs[1].poll() is None, "rank 1 ended before it could be killed:\n" + logs(out)
    os.kill(procs[1].pid, signal.SIGKILL)
    # Rank 0 must not hang on its dead peer: the next all-reduce fails (closed connection, or the
    # 30 s collective timeout at worst) and the process exits non-zero.
    killed = time.monotonic()
    codes = wait_all(procs, timeout=60)
    print(f"\nrank 1 SIGKILLed; rank 0 exited {codes[0]} after {time.monotonic() - killed:.1f} s")
    assert codes[1] == -signal.SIGKILL and codes[0] != 0, logs(out)
    assert not (out / "train_result.json").exists()  # a stage that did not finish is not done
    last = out / "checkpoints" / "last.ckpt"
    assert 4 <= torch.load(last, map_location="cpu", weights_only=False)["global_step"] < STEPS

    codes = wait_all(launch_nodes(over + ["ckpt_path=last"], out, tag="resume"))
    assert codes == [0, 0], logs(out)
    a, b = model_params(two_nodes / "checkpoints" / "last.ckpt"), model_params(last)
    assert a.keys() == b.keys()
    unequal = [k for k in a if not torch.equal(a[k], b[k])]
    assert not unequal, f"resumed weights differ from the uninterrupted 2-node run: {unequal}"
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == STEPS
