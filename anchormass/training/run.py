"""The train function behind train.py: check inputs, build module/data/trainer, fit.

Stage chaining: `init_from=<ckpt>` copies weights only and carries `trained_lengths`;
`ckpt_path=<ckpt>` (or `last`) resumes exactly: weights, optimizer, scheduler, loop counters,
data position and RNG state all come from the checkpoint.

The run folder belongs to this run while it trains (training/run_dir.py). Every logger records
the resolved config, the git commit and the data fingerprint; a resumed run continues the wandb
run it resumes.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LearningRateMonitor, ProgressBar
from omegaconf import DictConfig, OmegaConf, open_dict

from anchormass.config_checks import check_numbers
from anchormass.data.datamodule import datamodule_config
from anchormass.data.dataset_dir import fingerprint, verify_dataset
from anchormass.data.tokenizer_loader import load_tokenizer, tokenizer_in
from anchormass.errors import AnchorMassError, CheckpointError, ConfigError
from anchormass.models.config import FIELDS_ADDED_LATER, load_model_config
from anchormass.training.checkpoint import AtomicCheckpointIO, load_weights, read_checkpoint
from anchormass.training.checkpoint_tokenizer import carried
from anchormass.training.launch_checks import INT_SETTINGS, data_metadata
from anchormass.training.lit_module import LitLanguageModel
from anchormass.training.loggers import CarriedMetrics, attach_resume_step
from anchormass.training.preemption import TrainingInterrupted, stop_after_fit
from anchormass.training.resume_point import (
    checkpoint_step,
    clean_checkpoint_folder,
    latest_checkpoint,
    make_last_the_newest,
)
from anchormass.training.resume_settings import ResumeOverrides, check_resume_settings
from anchormass.training.run_dir import WANDB_ID_FILE, claim, is_launching_process, release
from anchormass.training.run_record import log_run_record, run_record
from anchormass.training.safe_load import safe_torch_load
from anchormass.training.slurm_requeue import requeue_resume
from anchormass.utils import atomic_write_json, atomic_write_text, writable_dir

RESULT_FILE = "train_result.json"


def finished_run(folder: Path) -> bool:
    """The run in `folder` trained all its steps (its train_result.json records completed: true at
    its total steps; a run stopped on a signal writes completed: false) and left its last checkpoint.
    A run still training has a periodic last.ckpt too, so the checkpoint alone says nothing."""
    path = Path(folder) / RESULT_FILE
    res = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return (res.get("completed") is True and res.get("global_step") == res.get("total_steps")
            and (Path(folder) / "checkpoints" / "last.ckpt").is_file())


def build(node: Any) -> Any:
    """hydra.utils.instantiate, but our own one-line errors come through unwrapped."""
    try:
        return instantiate(node)
    except InstantiationException as err:
        if isinstance(err.__cause__, AnchorMassError):
            raise err.__cause__ from None
        raise


def check_output_dir(path: str | os.PathLike) -> Path:
    """Create the run folder and prove it is writable now, not after an hour of training."""
    return writable_dir(path, "output folder")


def resolve_model_config(cfg: DictConfig, meta: dict):
    """The model preset with its vocab taken from the prepared data (the demo vocab is small)."""
    model_cfg = load_model_config(cfg.model)
    vocab = meta.get("vocab_size")
    if cfg.get("vocab_from_data", True) and vocab:
        model_cfg = model_cfg.replace(vocab_size=int(vocab))
    return model_cfg


def accumulation(stage: DictConfig, world_size: int) -> int:
    """Micro-batches per optimizer step: the fewest A with global = micro x devices x A and
    micro <= stage.micro_batch_size (the largest per-device batch that fits in memory)."""
    g, cap = int(stage.global_batch_size), int(stage.micro_batch_size)
    if g % world_size:
        raise ConfigError(f"stage.global_batch_size={g} cannot be split evenly over {world_size} devices")
    for acc in range(1, g // world_size + 1):
        if (g // world_size) % acc == 0 and g // (world_size * acc) <= cap:
            return acc
    raise ConfigError(f"stage.micro_batch_size must be >= 1, got {cap}")


def cap_devices(trainer_cfg: DictConfig, stage: DictConfig) -> None:
    """A stage whose global batch is smaller than the device count (stage 2: 2 x 4,096) runs on
    as many devices as it has sequences; the batches themselves do not change."""
    devices, g = trainer_cfg.get("devices", 1), int(stage.global_batch_size)
    if isinstance(devices, int) and devices > 1 and int(trainer_cfg.get("num_nodes", 1)) == 1 and devices > g:
        print(f"note: stage {stage.name} has global batch {g}: using {g} of {devices} devices")
        trainer_cfg.devices = g


def world_size_of(trainer_cfg: DictConfig) -> int:
    devices = trainer_cfg.get("devices", 1)
    if isinstance(devices, int):
        n = devices
    elif isinstance(devices, str) and devices.isdigit():
        n = int(devices)
    elif isinstance(devices, (list, tuple)) or OmegaConf.is_list(devices):
        n = len(devices)
    else:  # "auto" / -1: whatever Lightning finds; resolved after the trainer exists
        n = -1
    return n * int(trainer_cfg.get("num_nodes", 1)) if n > 0 else -1


def attach_wandb_id(cfg: DictConfig, out: Path, resume: str | None) -> None:
    """A wandb logger gets a run id kept in the run folder: a resumed run reuses the id of the run
    it resumes (found beside its checkpoint), so wandb continues that run; a fresh run gets a new one."""
    if not str(OmegaConf.select(cfg, "logger._target_", default="")).endswith("WandbLogger"):
        return
    run_id = None
    if resume:
        for folder in (out, Path(resume).resolve().parent.parent):  # <run>/checkpoints/<file>.ckpt
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


def build_trainer(cfg: DictConfig, out: Path, run_callbacks: list | tuple = ()) -> L.Trainer:
    cap_devices(cfg.trainer, cfg.stage)
    tcfg = OmegaConf.to_container(cfg.trainer, resolve=True)
    tcfg.pop("_target_", None)
    world = world_size_of(cfg.trainer)
    if world < 0:
        raise ConfigError("trainer.devices must be a count or a list of devices (the global batch is split by it)")
    tcfg.pop("peak_tflops", None)  # read by the Throughput callback, not a Trainer argument
    strategy = tcfg.pop("strategy", "auto")
    if isinstance(strategy, dict):
        strategy = build(strategy)
    logger = build(cfg.logger) if cfg.get("logger") else False
    callbacks = [build(c) for c in (cfg.get("callbacks") or {}).values() if c is not None] + list(run_callbacks)
    if not logger:  # LearningRateMonitor refuses to run without a logger
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    if not tcfg.get("enable_progress_bar", True):  # nor may a progress bar exist when it is off
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    accumulate = accumulation(cfg.stage, world)
    return L.Trainer(
        **tcfg,
        strategy=strategy,
        default_root_dir=str(out),
        max_steps=int(cfg.stage.total_steps),
        max_epochs=-1,
        accumulate_grad_batches=accumulate,
        # Validation every N optimizer steps; Lightning counts micro-batches here.
        val_check_interval=int(cfg.stage.val_every) * accumulate,
        check_val_every_n_epoch=None,
        limit_val_batches=int(cfg.stage.val_batches),
        # The data sampler slices each global batch by rank itself (docs/method.md §4).
        use_distributed_sampler=False,
        callbacks=callbacks,
        logger=logger,
        plugins=[AtomicCheckpointIO()] if not _is_fsdp(strategy) else None,
    )


def _is_fsdp(strategy: Any) -> bool:
    return "fsdp" in (strategy if isinstance(strategy, str) else type(strategy).__name__).lower()


# Fields that make two models different architectures even when their tensors have equal shapes
# (Standard and AnchorMass have identical parameter lists).
ARCH_FIELDS = ("arch", "n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab_size",
               "tie_embeddings", "n_local_heads", "n_global_heads")


# What `init_across_arch=true` lets differ: Standard <-> AnchorMass with the same tensors (uptraining
# a Standard checkpoint into AnchorMass, or a curriculum's shared stage, docs/method.md §5).
ACROSS_ARCH_FIELDS = ("arch", "n_local_heads", "n_global_heads")


def check_same_architecture(saved: dict, model_cfg, path, across_arch: bool = False) -> None:
    now = model_cfg.to_dict()
    saved = {**FIELDS_ADDED_LATER, **saved}  # a checkpoint older than a field has its earlier value
    differ = [k for k in ARCH_FIELDS if saved.get(k) != now[k] and not (across_arch and k in ACROSS_ARCH_FIELDS)]
    if differ:
        detail = "; ".join(f"{k}: {saved.get(k)} in checkpoint vs {now[k]}" for k in differ)
        hint = ("; init_across_arch=true starts one architecture from the other's weights"
                if not across_arch and set(differ) <= set(ACROSS_ARCH_FIELDS) else "")
        raise CheckpointError(f"{path} is a different model ({detail}){hint}")


def check_same_tokenizer(saved: dict, meta: dict, path, data_dir: Path) -> None:
    """Token ids only mean the same thing under the same tokenizer: a stage's data must be
    tokenized like the data its starting checkpoint was trained on."""
    before, now = saved.get("tokenizer_checksum"), meta.get("tokenizer_checksum")
    if before and now and before != now:
        raise CheckpointError(f"init_from {path} was trained with tokenizer {before[:12]}, but {data_dir} is "
                              f"tokenized with {now[:12]}; prepare the data with the checkpoint's tokenizer")


def build_module(cfg: DictConfig, data_dir: Path, meta: dict) -> LitLanguageModel:
    model_cfg = resolve_model_config(cfg, meta)
    start = cfg.get("ckpt_path") or cfg.get("init_from")
    start_ckpt = read_checkpoint(start) if start else None
    if start_ckpt is not None:
        # a resume continues the same run; only a fresh start may cross architectures
        across = bool(cfg.get("init_across_arch", False)) and not cfg.get("ckpt_path")
        check_same_architecture(start_ckpt["hyper_parameters"]["model_config"], model_cfg, start, across)
    resume_changes = (check_resume_settings(start_ckpt, cfg, fingerprint(data_dir), start)
                      if start_ckpt is not None and cfg.get("ckpt_path") else [])
    # Lengths trained so far (RoPE original_max_len) come from the run we continue or start from.
    trained_lengths = list(start_ckpt["hyper_parameters"].get("trained_lengths", [])) if start_ckpt else []
    # tokenizer.model, or an imported tokenizer's folder: the checkpoint carries its bytes (checkpoint_tokenizer.py)
    tokenizer = tokenizer_in(data_dir, meta).resolve()
    module = LitLanguageModel(
        model_config=model_cfg.to_dict(), total_steps=cfg.stage.total_steps, seq_len=cfg.stage.seq_len,
        optim=OmegaConf.to_container(cfg.optim, resolve=True), trained_lengths=trained_lengths,
        tokenizer_path=str(tokenizer) if tokenizer.exists() else None,
        tokenizer_files=carried(load_tokenizer(tokenizer)) if tokenizer.exists() else None,
        data_fingerprint=fingerprint(data_dir), stage=str(cfg.stage.name),
        loss_chunk=int(cfg.stage.get("loss_chunk", 1024)), tokenizer_checksum=meta.get("tokenizer_checksum"))
    if start_ckpt is not None and not cfg.get("ckpt_path"):
        # init_from: weights only (a resume gets everything from Lightning's own restore).
        check_same_tokenizer(start_ckpt["hyper_parameters"], meta, start, data_dir)
        load_weights(module.model, start_ckpt, start)
    module.resume_changes = resume_changes  # made to take effect by ResumeOverrides (resume_settings.py)
    return module


def last_of_run(out: Path) -> Path:
    """`ckpt_path=last`: the run folder's checkpoint with the highest recorded step, whatever the
    files are called and wherever the folder was copied or moved from (training/resume_point.py)."""
    found = latest_checkpoint(out / "checkpoints")
    if found is None:
        raise CheckpointError(f"ckpt_path=last: no checkpoint in {out / 'checkpoints'}; "
                              f"start the run without ckpt_path, or pass ckpt_path=<file>")
    return found


def clean_before_resume(cfg: DictConfig, resume: str) -> str:
    """What an interrupted run left: temp files, periodic checkpoints beyond the kept count, a
    last.ckpt older than the resume point. Returns the resume point's path (it may be renamed)."""
    ckpt_cfg = OmegaConf.select(cfg, "callbacks.model_checkpoint") or {}
    folder = Path(ckpt_cfg.get("dirpath") or Path(cfg.output_dir) / "checkpoints")
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
    # (training/slurm_requeue.py).
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
    except TrainingInterrupted as err:  # saved at a step boundary (training/preemption.py): recorded, then re-raised
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
