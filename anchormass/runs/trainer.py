"""The Lightning Trainer of one run, built from the composed train config: devices, the batch split
into micro-batches, validation and checkpoint intervals, loggers and callbacks from their configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LearningRateMonitor, ProgressBar
from omegaconf import DictConfig, OmegaConf

from anchormass.errors import AnchorMassError, ConfigError
from anchormass.training.checkpoint import AtomicCheckpointIO


def build(node: Any) -> Any:
    """hydra.utils.instantiate, but our own one-line errors come through unwrapped."""
    try:
        return instantiate(node)
    except InstantiationException as err:
        if isinstance(err.__cause__, AnchorMassError):
            raise err.__cause__ from None
        raise


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

