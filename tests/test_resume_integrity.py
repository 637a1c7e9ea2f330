"""Resuming loses and changes nothing (issue 24, items 2-4): every logger continues one history,
a copied run folder resumes from its newest weights, a changed setting is refused or really used.

An interrupted run is simulated by a run stopped at step 5 of 6 and resumed from its step-4
checkpoint: whatever it logged at steps >= 4 came after that checkpoint, as after a kill."""

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from anchormass.errors import ConfigError
from anchormass.own_files import RECORD
from anchormass.runs.train import train
from anchormass.training.optim import lr_factor

from _train_helpers import FAST, REFERENCE, compose_train, csv_rows, model_params, run_train

# The shared reference's settings (conftest.py's `reference`, the uninterrupted run), any logger.
SIX = [s for s in REFERENCE if s != "logger=csv"]
STOP_AT_5 = ["+callbacks.stop._target_=test_resume_integrity.StopAt", "+callbacks.stop.step=5"]


class StopAt(Callback):
    """Test hook: end training after optimizer step `step` (last.ckpt is written there)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def interrupted_then_resumed(over: list[str], out: Path, resumes: int = 1) -> dict:
    """Stop at step 5, resume from step 4 (to the end), then `resumes - 1` more `ckpt_path=last`.
    The stopped run's metrics.csv (if any) ends in half a row, as when killed mid-append."""
    train(compose_train([*over, *STOP_AT_5], out))
    if (out / "logs" / "metrics.csv").is_file():
        with open(out / "logs" / "metrics.csv", "a") as fh:
            fh.write("0,5.1")
    result = train(compose_train([*over, f"ckpt_path={out / 'checkpoints' / 'step-0000004.ckpt'}"], out))
    for _ in range(resumes - 1):
        result = train(compose_train([*over, "ckpt_path=last"], out))
    return result


# ---------------------------------------------------------------------------- item 2: loggers
def test_csv_history_is_continued_across_resumes_and_a_finished_run_keeps_its_metrics(data, reference, tmp_path):
    over = [f"data_dir={data['pretrain']}", *SIX, "logger=csv"]
    full = json.loads((reference / "train_result.json").read_text())
    out = tmp_path / "run"
    # Two resumes: the second finds the run finished, trains nothing and must keep everything.
    result = interrupted_then_resumed(over, out, resumes=2)
    rows, expected = csv_rows(out), csv_rows(reference)
    assert [r[0] for r in rows] == [r[0] for r in expected]  # steps 0..5, each once per logged group
    assert rows == expected  # bitwise-exact resume: the same values, no row lost or repeated
    assert result["global_step"] == 6
    saved = json.loads((out / "train_result.json").read_text())["metrics"]
    for key in ("val/loss", "train/loss"):
        assert saved[key] == full["metrics"][key], key


def tensorboard_scalars(out: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_tensorboard_history_is_continued_across_a_resume(data, tmp_path):
    over = [f"data_dir={data['pretrain']}", *SIX, "logger=tensorboard"]
    train(compose_train(over, tmp_path / "full"))
    interrupted_then_resumed(over, tmp_path / "run")
    for tag in ("train/loss", "val/loss"):
        got, want = tensorboard_scalars(tmp_path / "run", tag), tensorboard_scalars(tmp_path / "full", tag)
        assert got == want, tag  # today: step 4 twice, and the interrupted run's step-4 validation


def wandb_records(run_dir: Path) -> list:
    """The protobuf records of an offline run folder's .wandb file (a LevelDB-style log)."""
    from wandb.proto import wandb_internal_pb2

    raw = next(run_dir.glob("*.wandb")).read_bytes()
    assert raw[:4] == b":W&B"
    block, head, pos, pending, records = 32768, 7, 7, b"", []
    while pos + head <= len(raw):
        if block - pos % block < head:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + head])
        if kind == 0 and length == 0:
            pos += block - pos % block
            continue
        pending += raw[pos + head:pos + head + length]
        pos += head + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            records.append(record)
    return records


def wandb_history(run_dir: Path) -> list[dict]:
    """History rows of an offline run, in order."""
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in wandb_records(run_dir) if r.WhichOneof("record_type") == "history"]


@pytest.mark.slow
def test_wandb_resumed_segment_continues_the_step_axis(data, tmp_path):
    out = tmp_path / "run"
    over = [f"data_dir={data['pretrain']}", *SIX, "logger=wandb", "run_name=pair"]
    for extra in ([*STOP_AT_5, "verbose=0"], [f"ckpt_path={out / 'checkpoints' / 'step-0000004.ckpt'}"]):
        proc = run_train([*over, *extra], out)
        assert proc.returncode == 0, proc.stderr[-3000:]
        if "verbose=0" in extra:  # quiet means wandb's banners too
            assert "wandb:" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    folders = sorted((out / "wandb").glob("offline-run-*"))
    (run,) = [r.run for r in wandb_records(folders[0]) if r.WhichOneof("record_type") == "run"][:1]
    assert run.run_group == "pair" and list(run.tags) == ["anchormass_tiny", "pretrain_1k"]  # the curriculum's group
    first, resumed = (wandb_history(d) for d in folders)
    # wandb's own step is the trainer's: one row per step, and the resumed segment starts at the
    # checkpoint's step (today it restarts at 0 and counts log calls).
    assert [r["_step"] for r in first] == [0, 1, 2, 3, 4]
    assert [r["_step"] for r in resumed] == [4, 5]
    assert all(r["_step"] == r["trainer/global_step"] for r in first + resumed)
    assert "val/loss" in resumed[-1]


# ---------------------------------------------------------------------------- item 3: copied folders
def ckpt_names(out: Path) -> list[str]:
    return sorted(p.name for p in (out / "checkpoints").iterdir() if p.name != RECORD)  # the names our runs wrote


def test_a_copied_run_folder_resumes_from_its_newest_checkpoint_without_v_copies(data, reference, tmp_path):
    over = [f"data_dir={data['pretrain']}", *SIX, "callbacks.model_checkpoint.save_top_k=2"]
    a, b = tmp_path / "a", tmp_path / "b"
    train(compose_train([*over, "+callbacks.stop._target_=test_resume_integrity.StopAt", "+callbacks.stop.step=4"], a))
    assert ckpt_names(a) == ["last.ckpt", "step-0000002.ckpt", "step-0000004.ckpt"]
    shutil.copytree(a, b)
    (b / "checkpoints" / ".last.ckpt.k2j3x.tmp").write_bytes(b"half a checkpoint")  # a killed write
    # Keeping 1 now: the next start removes the periodic checkpoint beyond it, and the temp file.
    one = [*over, "callbacks.model_checkpoint.save_top_k=1", "ckpt_path=last"]
    assert train(compose_train(one, b))["global_step"] == 6
    assert ckpt_names(b) == ["last.ckpt", "step-0000006.ckpt"]  # no last-v1.ckpt, the copy's own rotation
    assert torch.load(b / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 6
    # The copy trained exactly what the original would have: the uninterrupted run.
    want, got = model_params(reference / "checkpoints" / "last.ckpt"), model_params(b / "checkpoints" / "last.ckpt")
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_checkpoints_of_a_plain_model_checkpoint_keep_rotating_after_the_change(data, tmp_path):
    """Runs started before FolderCheckpoint: their ModelCheckpoint state (the kept files) restores."""
    out = tmp_path / "run"
    over = [f"data_dir={data['pretrain']}", *SIX, "callbacks.model_checkpoint.save_top_k=1"]
    plain = ["callbacks.model_checkpoint._target_=lightning.pytorch.callbacks.ModelCheckpoint",
             "~callbacks.model_checkpoint.enable_version_counter"]
    train(compose_train([*over, *plain, "+callbacks.stop._target_=test_resume_integrity.StopAt",
                         "+callbacks.stop.step=2"], out))
    train(compose_train([*over, "ckpt_path=last"], out))
    assert ckpt_names(out) == ["last.ckpt", "step-0000006.ckpt"]  # step 2 rotated out as it would have been


def test_resume_point_is_the_highest_recorded_step_not_the_name(data, reference, tmp_path, capsys):
    over = [f"data_dir={data['pretrain']}", *SIX]
    done = reference  # the same run, finished
    old = tmp_path / "old"
    train(compose_train([*over, "+callbacks.stop._target_=test_resume_integrity.StopAt",
                         "+callbacks.stop.step=2"], old))
    # A folder whose last.ckpt is stale (step 2) beside a newer checkpoint under another name,
    # as today's `cp -r` + resume leaves it (last-v1.ckpt).
    run = tmp_path / "run"
    shutil.copytree(old, run)
    shutil.copy(done / "checkpoints" / "last.ckpt", run / "checkpoints" / "last-v1.ckpt")
    result = train(compose_train([*over, "ckpt_path=last"], run))
    assert result["global_step"] == 6
    assert "is at step 6 of stage.total_steps=6" in capsys.readouterr().out  # nothing retrained
    want, got = model_params(done / "checkpoints" / "last.ckpt"), model_params(Path(result["last_checkpoint"]))
    assert all(torch.equal(want[k], got[k]) for k in want)


# ---------------------------------------------------------------------------- item 4: changed settings
def folder_bytes(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and ".hydra" not in p.parts and p.suffix != ".log"}


def test_a_resume_with_changed_settings_is_refused_in_one_line_and_writes_nothing(data, tmp_path):
    out = tmp_path / "run"
    over = [f"data_dir={data['pretrain']}", *FAST, "stage.total_steps=4", "logger=csv"]
    train(compose_train([*over, "+callbacks.stop._target_=test_resume_integrity.StopAt",
                         "+callbacks.stop.step=2"], out))
    before = folder_bytes(out)
    with pytest.raises(ConfigError) as err:  # exit 2 and one `error:` line through anchormass.cli
        train(compose_train([*over, "ckpt_path=last", "stage.lr=1e-3", "stage.total_steps=8", "seed=7"], out))
    line = str(err.value)
    assert "\n" not in line
    assert "optim.lr: 0.0006 in the checkpoint vs 0.001 now" in line
    assert "stage.total_steps: 4 in the checkpoint vs 8 now" in line
    assert "seed: 42 in the checkpoint vs 7 now" in line  # a data-order setting
    assert "resume_overrides=[optim.lr,stage.total_steps,seed]" in line
    assert folder_bytes(out) == before


def test_resume_overrides_make_the_new_value_take_effect_and_be_recorded(data, tmp_path):
    over = [f"data_dir={data['pretrain']}", *FAST, "stage.total_steps=4"]
    stop = ["+callbacks.stop._target_=test_resume_integrity.StopAt", "+callbacks.stop.step=2"]
    plain, changed = tmp_path / "plain", tmp_path / "changed"
    for out in (plain, changed):
        train(compose_train([*over, *stop], out))
    train(compose_train([*over, "ckpt_path=last"], plain))
    with pytest.raises(ConfigError, match="unknown key"):
        train(compose_train([*over, "ckpt_path=last", "resume_overrides=[optim.learning_rate]"], changed))
    train(compose_train([*over, "ckpt_path=last", "stage.lr=1e-3", "resume_overrides=[stage.lr]"], changed))
    ckpt = torch.load(changed / "checkpoints" / "last.ckpt", weights_only=False)
    hp = ckpt["hyper_parameters"]
    assert hp["optim"]["lr"] == 1e-3
    assert hp["resume_overrides"] == [{"step": 2, "key": "optim.lr", "checkpoint": 6e-4, "now": 1e-3}]
    # The optimiser ran at the new rate: its base lr, and the lr of the last step on the new curve.
    group = ckpt["optimizer_states"][0]["param_groups"][0]
    assert group["initial_lr"] == 1e-3 and ckpt["lr_schedulers"][0]["base_lrs"][0] == 1e-3
    assert group["lr"] == pytest.approx(1e-3 * lr_factor(4, warmup_steps=1, total_steps=4, min_lr_ratio=0.1))
    a, b = model_params(plain / "checkpoints" / "last.ckpt"), model_params(changed / "checkpoints" / "last.ckpt")
    assert any(not torch.equal(a[k], b[k]) for k in a)  # today: bitwise equal (the change is ignored)
