"""A run folder belongs to one run: the lock (concurrent launch refused, stale lock taken over),
no fresh run over another run's checkpoints, overwrite=true, stale prepare staging folders."""

import json
import os
import subprocess
import sys
import time

import pytest
import yaml
from lightning.pytorch.callbacks import Callback

from anchormass.data.testing import tiny_pretrain
from anchormass.dir_lock import DirLock, FolderBusy
from anchormass.errors import ConfigError
from anchormass.own_files import STAGING_MARK
from anchormass.runs.run_dir import LOCK_FILE
from anchormass.runs.train import train

from _train_helpers import FAST, REPO, compose_train, run_train, subprocess_env, train_cmd


class HoldUntil(Callback):
    """Test hook (loaded by train.py subprocesses): after optimizer step `step`, create
    `<path>.waiting` and wait until the file `path` exists, so the run is surely still going
    while the test does something else."""

    def __init__(self, step: int, path: str):
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            open(f"{self.path}.waiting", "w").close()
        deadline = time.monotonic() + 300
        while trainer.global_step == self.step and not os.path.exists(self.path) and time.monotonic() < deadline:
            time.sleep(0.05)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def ckpt_names(out) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").glob("*.ckpt"))


def wait_for(predicate, proc, seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert proc.poll() is None, f"the first run ended early (exit {proc.returncode})"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.slow
def test_concurrent_launch_into_the_same_folder_is_refused_in_one_line(data, tmp_path):
    out = tmp_path / "run"
    over = [f"data_dir={data['pretrain']}", *FAST, "stage.total_steps=4"]
    # The first run waits after step 1 (holding its folder) until the test lets it go on.
    go_on = tmp_path / "go_on"
    hold = ["+callbacks.hold._target_=test_run_dir.HoldUntil", "+callbacks.hold.step=1",
            f"+callbacks.hold.path={go_on}"]
    first = subprocess.Popen(train_cmd(over + hold, out), cwd=REPO, env=subprocess_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for((tmp_path / "go_on.waiting").is_file, first)
        records = {p.name: p.read_bytes() for p in (out / ".hydra").iterdir()}
        second = run_train(over, out)
        assert second.returncode == 2, second.stderr[-3000:]
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "is in use" in lines[0], second.stderr
        assert f"pid {first.pid} on " in lines[0] and "started " in lines[0]
        assert first.poll() is None, "the refusal must not have disturbed the first run"
        # Refused before Hydra wrote anything: the first run's record of its config is intact.
        assert {p.name: p.read_bytes() for p in (out / ".hydra").iterdir()} == records
    finally:
        go_on.touch()
        _, err = first.communicate(timeout=240)
    assert first.returncode == 0, err[-3000:]
    # Only the first run's files: no -v1 duplicates, its own result, its lock released.
    assert ckpt_names(out) == ["last.ckpt", "step-0000002.ckpt", "step-0000004.ckpt"]
    assert json.loads((out / "train_result.json").read_text())["global_step"] == 4
    assert not (out / LOCK_FILE).exists()


def test_stale_lock_of_a_dead_process_is_taken_over(data, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    gone = dead_pid()
    (out / LOCK_FILE).write_text(json.dumps({"pid": gone, "host": "somewhere", "started": 0}))
    result = train(compose_train([f"data_dir={data['pretrain']}", *FAST], out))
    assert result["global_step"] == 2
    assert f"pid {gone} on somewhere" in capsys.readouterr().err
    assert not (out / LOCK_FILE).exists()  # released at the end


def test_lock_held_by_a_live_process_names_it(tmp_path):
    script = ("import sys, time; from anchormass.dir_lock import DirLock; "
              "DirLock(sys.argv[1], 'x').acquire(); print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "l.lock")], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderBusy, match=f"folder X is in use by another process \\(pid {holder.pid} on "):
            DirLock(tmp_path / "l.lock", "folder X").acquire()
    finally:
        holder.kill()
        holder.wait()
    with DirLock(tmp_path / "l.lock", "folder X") as lock:  # the kernel dropped the dead holder's lock
        assert lock.previous["pid"] == holder.pid


def test_fresh_run_over_another_runs_checkpoints_is_refused(data, tmp_path):
    out = tmp_path / "run"
    over = [f"data_dir={data['pretrain']}", *FAST]
    train(compose_train(over, out))
    before = {n: (out / "checkpoints" / n).read_bytes() for n in ckpt_names(out)}
    with pytest.raises(ConfigError, match="already holds another run's checkpoints") as err:
        train(compose_train(over, out))
    assert "\n" not in str(err.value) and "ckpt_path=last" in str(err.value) and "overwrite=true" in str(err.value)
    assert {n: (out / "checkpoints" / n).read_bytes() for n in ckpt_names(out)} == before  # untouched
    assert not (out / LOCK_FILE).exists()

    # Resuming is allowed: the same run goes on to step 4 in the same files.
    resumed = train(compose_train([*over, "stage.total_steps=4", "resume_overrides=[stage.total_steps]",
                                   "ckpt_path=last"], out))
    assert resumed["global_step"] == 4
    assert ckpt_names(out) == ["last.ckpt", "step-0000002.ckpt", "step-0000004.ckpt"]


def test_overwrite_replaces_the_old_run(data, tmp_path):
    out = tmp_path / "run"
    over = [f"data_dir={data['pretrain']}", *FAST]
    train(compose_train([*over, "stage.total_steps=4", "logger=csv"], out))
    assert (out / "logs" / "metrics.csv").is_file()
    result = train(compose_train([*over, "overwrite=true"], out))
    assert result["global_step"] == 2
    # Only the new run's files: its step-2 checkpoint, no -v1 copies, the old step-4 one gone.
    assert ckpt_names(out) == ["last.ckpt", "step-0000002.ckpt"]
    assert not (out / "logs").exists()
    assert json.loads((out / "train_result.json").read_text())["global_step"] == 2


def test_every_run_records_config_commit_and_data(data, tmp_path):
    from anchormass.data.dataset_dir import fingerprint
    from anchormass.utils import git_commit

    out = tmp_path / "run"
    train(compose_train([f"data_dir={data['pretrain']}", *FAST, "logger=csv", "optim.weight_decay=0.05"], out))
    hparams = yaml.safe_load((out / "logs" / "hparams.yaml").read_text())
    assert hparams["data_fingerprint"] == fingerprint(data["pretrain"])
    assert hparams["git_commit"] == git_commit()
    assert hparams["optim.weight_decay"] == 0.05 and hparams["output_dir"] == str(out)


@pytest.mark.slow
def test_resumed_run_continues_the_same_wandb_run(data, tmp_path):
    out = tmp_path / "run"
    over = [f"data_dir={data['pretrain']}", *FAST, "logger=wandb"]
    first = run_train(over, out)
    assert first.returncode == 0, first.stderr[-3000:]
    run_id = (out / "wandb_run_id").read_text().strip()
    resumed = run_train([*over, "stage.total_steps=4", "resume_overrides=[stage.total_steps]", "ckpt_path=last"], out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (out / "wandb_run_id").read_text().strip() == run_id
    # Offline, each process writes its own folder, named after the run id it logged to.
    runs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(f"-{run_id}") for r in runs), runs
    # A fresh run (overwrite) is a new wandb run.
    fresh = run_train([*over, "overwrite=true"], out)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert (out / "wandb_run_id").read_text().strip() != run_id


def test_prepare_removes_staging_folders_left_by_a_killed_prepare(tmp_path):
    for leftover, proof in ((".tiny.staging-k3j2x9", STAGING_MARK), (".tiny.old-4242", "meta.json"),
                            (".tiny.staging-user", None)):   # the last proves nothing: not removed
        (tmp_path / leftover).mkdir()
        (tmp_path / leftover / "train.bin").write_bytes(b"partial")
        if proof:
            (tmp_path / leftover / proof).write_bytes(b"")
    (tmp_path / ".tiny.staging-empty").mkdir()  # killed before its mark: empty, removed
    (tmp_path / ".other.staging-abc").mkdir()  # another dataset's: not ours to remove
    tiny_pretrain(tmp_path / "tiny")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.staging-abc", ".tiny.staging-user", "tiny"]


def test_prepare_refuses_while_another_prepare_of_the_same_folder_runs(tmp_path):
    with DirLock(tmp_path / ".tiny.lock", "held by the test"):
        (tmp_path / ".tiny.staging-live").mkdir()  # the running prepare's: must survive
        with pytest.raises(FolderBusy,
                           match=f"dataset folder .*tiny is in use by another process \\(pid {os.getpid()}"):
            tiny_pretrain(tmp_path / "tiny")
        assert (tmp_path / ".tiny.staging-live").is_dir()
