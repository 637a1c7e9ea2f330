"""The train function behind train.py: check inputs, build the module (start_module.py), the data and
the trainer (trainer.py), fit, and record the result in the run folder (layout.py: train_result.json).

Stage chaining: `init_from=<ckpt>` copies weights only and carries `trained_lengths`;
`ckpt_path=<ckpt>` (or `last`) resumes exactly: weights, optimizer, scheduler, loop counters,
data position and RNG state all come from the checkpoint.

The run folder belongs to this run while it trains (runs/run_dir.py). Every logger records
the resolved config, the git commit and the data fingerprint; a resumed run continues the wandb
run it resumes.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from anchormass.config_checks import check_numbers
from anchormass.data.datamodule import datamodule_config
from anchormass.data.dataset_dir import fingerprint, verify_dataset
from anchormass.errors import CheckpointError
from anchormass.runs.launch_checks import INT_SETTINGS, data_metadata
from anchormass.runs.layout import RESULT_FILE, checkpoints_dir, run_of_checkpoint
from anchormass.runs.loggers import CarriedMetrics, attach_resume_step
from anchormass.runs.preemption import TrainingInterrupted, stop_after_fit
from anchormass.runs.resume_point import (
    checkpoint_step,
    clean_checkpoint_folder,
    latest_checkpoint,
    make_last_the_newest,
)
from anchormass.runs.resume_settings import ResumeOverrides
from anchormass.runs.run_dir import WANDB_ID_FILE, claim, is_launching_process, release
from anchormass.runs.run_record import log_run_record, run_record
from anchormass.runs.slurm_requeue import requeue_resume
from anchormass.runs.start_module import build_module
from anchormass.runs.trainer import build, build_trainer
from anchormass.training.safe_load import safe_torch_load
from anchormass.utils import atomic_write_json, atomic_write_text, writable_dir


def check_output_dir(path: str | os.PathLike) -> Path:
    """Create the run folder and prove it is writable now, not after an hour of training."""
    return writable_dir(path, "output folder")


def attach_wandb_id(cfg: DictConfig, out: Path, resume: str | None) -> None:
    """A wandb logger gets a run id kept in the run folder: a resumed run reuses the id of the run
    it resumes (found beside its checkpoint), so wandb continues that run; a fresh run gets a new one."""
    if not str(OmegaConf.select(cfg, "logger._target_", default="")).endswith("WandbLogger"):
        return
    run_id = None
    if resume:
        for folder in (out, run_of_checkpoint(Path(resume).resolve())):
            if (folder / WANDB_ID_FILE).is_file():
                run_id = (folder / WANDB_ID_FILE).read_text(encoding="utf-8").strip() or None
                break
    # From the OS, not the seeded generators: naming the run must not shift the training's random numbers.
    run_id = run_id or secrets.token_hex(4)
    with open_dict(cfg.logger):
        cfg.logger.id = run_id
        cfg.logger.resume = "allow"
    if is_launching_process():
        atomic_write_text(out / WANDB_ID_FILE, run_id + "\n")


def last_of_run(out: Path) -> Path:
    """`ckpt_path=last`: the run folder's checkpoint with the highest recorded step, whatever the
    files are called and wherever the folder was copied or moved from (runs/resume_point.py)."""
    found = latest_checkpoint(checkpoints_dir(out))
    if found is None:
        raise CheckpointError(f"ckpt_path=last: no checkpoint in {checkpoints_dir(out)}; "
                              f"start the run without ckpt_path, or pass ckpt_path=<file>")
    return found


def clean_before_resume(cfg: DictConfig, resume: str) -> str:
    """What an interrupted run left: temp files, periodic checkpoints beyond the kept count, a
    last.ckpt older than the resume point. Returns the resume point's path (it may be renamed)."""
    ckpt_cfg = OmegaConf.select(cfg, "callbacks.model_checkpoint") or {}
    folder = Path(ckpt_cfg.get("dirpath") or checkpoints_dir(cfg.output_dir))
    keep = int(ckpt_cfg.get("save_top_k", -1))  # no periodic checkpoints configured: keep them all
    for path in clean_checkpoint_folder(folder, keep, Path(cfg.output_dir), protect=Path(resume)):
        print(f"note: removed {path.name} left in {folder} by an earlier run", file=sys.stderr)
    resume = str(make_last_the_newest(folder, Path(resume)))
    cfg.ckpt_path = resume
    return resume


def train(cfg: DictConfig) -> dict:
    """Run one stage; returns {'output_dir', 'last_checkpoint', 'metrics'}."""
    check_numbers(cfg, INT_SETTINGS)
    # A job Slurm runs again after a requeue reruns its command: it continues its run folder
    # (runs/slurm_requeue.py).
    resume = cfg.get("ckpt_path") or requeue_resume(cfg.output_dir)
    if resume == "last":  # resolved here so its hparams are read too
        resume = str(last_of_run(Path(cfg.output_dir)))
        cfg.ckpt_path = resume
    if resume and not Path(resume).is_file():
        raise CheckpointError(f"ckpt_path not found: {resume}")
    # Both starting checkpoints are opened with the weights-only reader (memory-mapped) before anything
    # is built: one holding Python objects is refused in one line (training/safe_load.py).
    resume_step = checkpoint_step(resume) if resume else None
    attach_resume_step(cfg, resume_step)  # the loggers drop what the interrupted run logged after it
    if resume_step is not None and resume_step >= int(cfg.stage.total_steps):
        print(f"note: {resume} is at step {resume_step} of stage.total_steps={int(cfg.stage.total_steps)}: "
              f"nothing left to train; its last metrics are kept")
    if cfg.get("init_from") and not Path(cfg.init_from).is_file():
        raise CheckpointError(f"init_from checkpoint not found: {cfg.init_from}")
    if cfg.get("init_from"):
        safe_torch_load(cfg.init_from, mmap=True)
    data_dir = Path(cfg.data_dir)
    meta = data_metadata(data_dir)
    verify_dataset(data_dir)  # every split file against its sidecar's sha256 (~2 s per GB, data/README.md)
    out = check_output_dir(cfg.output_dir)
    claim(out, resume=bool(resume), overwrite=bool(cfg.get("overwrite", False)))
    try:
        return _train(cfg, out, data_dir, meta, resume)
    finally:
        release(out)


def _train(cfg: DictConfig, out: Path, data_dir: Path, meta: dict, resume: str | None) -> dict:
    if cfg.get("torch_threads"):
        torch.set_num_threads(int(cfg.torch_threads))
    L.seed_everything(int(cfg.seed), workers=True, verbose=False)
    module = build_module(cfg, data_dir, meta)  # refuses a resume with changed settings: nothing written yet
    if resume and is_launching_process():
        resume = clean_before_resume(cfg, resume)
    datamodule = build(datamodule_config(cfg.stage.datamodule, meta["kind"]))
    attach_wandb_id(cfg, out, resume)
    trainer = build_trainer(cfg, out, [CarriedMetrics(out / RESULT_FILE), ResumeOverrides(module.resume_changes)])
    log_run_record(trainer.loggers, run_record(cfg, module.model_cfg.to_dict(), fingerprint(data_dir)))
    interrupted = None
    try:
        # weights_only: Lightning's own restore unpickles nothing but data, whichever strategy reads it
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume, weights_only=True)
    except TrainingInterrupted as err:  # saved at a step boundary (runs/preemption.py): recorded, then re-raised
        interrupted = err
    # a stop at the last step ends the stage complete, and still exits resumable
    stopped_at_end = None if interrupted is not None else stop_after_fit(trainer)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
    last = next((cb.last_model_path for cb in trainer.checkpoint_callbacks if cb.last_model_path), None)
    total = int(cfg.stage.total_steps)
    result = {"output_dir": str(out), "last_checkpoint": last, "metrics": metrics,
              "global_step": trainer.global_step, "total_steps": total,
              # a stage is done only when this is true (the curriculum skips it): an interrupted run says false
              "completed": interrupted is None and trainer.global_step == total,
              "stage": str(cfg.stage.name), "model": module.model_cfg.name}
    if trainer.is_global_zero:
        # the curriculum reads this to know a stage is done
        atomic_write_json(out / RESULT_FILE, result, sort_keys=True, indent=2)
    if interrupted is not None or stopped_at_end is not None:
        raise interrupted or stopped_at_end
    return result

