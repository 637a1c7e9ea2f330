"""What train.py checks on the composed config before Hydra creates the run folder (.hydra/,
train.log): a run refused for its settings, its machine or its inputs leaves nothing behind.

Each check raises a one-line AnchorMassError naming the key the user wrote; launch.py passes
`check_train_launch` to cli.check_overrides, which runs it on every variant of a sweep.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from anchormass.config_checks import COUNT, NON_NEGATIVE, NON_NEGATIVE_WHOLE, POSITIVE
from anchormass.data.dataset_dir import read_metadata
from anchormass.errors import CheckpointError, ConfigError, DataError
from anchormass.utils import resolve_path

# Numeric settings train() reads with int() / float(): a word, 20.7 for a step count or 0 steps
# between validations must be a one-line ConfigError, not a traceback or a silently changed run.
# stage.* come first so `stage.lr=fast` is named as written, not as optim.lr's interpolation.
INT_SETTINGS = {
    **dict.fromkeys(("seed", "stage.val_batches", "stage.warmup_steps"), NON_NEGATIVE_WHOLE),
    **dict.fromkeys(("torch_threads", "stage.seq_len", "stage.total_steps", "stage.global_batch_size",
                     "stage.micro_batch_size", "stage.val_every", "stage.ckpt_every", "stage.loss_chunk"), COUNT),
    "stage.lr": POSITIVE, "optim.lr": POSITIVE, "optim.warmup_steps": NON_NEGATIVE_WHOLE,
    "optim.weight_decay": NON_NEGATIVE, "optim.min_lr_ratio": NON_NEGATIVE, "optim.eps": POSITIVE,
}


def data_metadata(data_dir: str | os.PathLike) -> dict:
    """The prepared dataset's meta.json (vocab size, kind, tokenizer checksum, ...). Here, not in
    run.py, so that a launch refused for its data stops before torch and Lightning load (~8 s)."""
    if not resolve_path(data_dir).is_dir():
        from anchormass.command_names import command

        here = f" (a relative path is taken from the current folder, {Path.cwd()})"
        where = "" if Path(data_dir).is_absolute() else here
        raise DataError(f"no prepared data folder {data_dir}{where}; run: {command('scripts/prepare_data.py')} "
                        f"data=<name> here, or pass data_dir=<folder>")
    return read_metadata(data_dir)


def warmup_key(cfg: Any) -> str:
    """The key that sets the run's warmup: `optim.warmup_steps` follows `stage.warmup_steps`
    unless the user overrode it."""
    optim = cfg.get("optim")
    if optim is not None and OmegaConf.is_interpolation(optim, "warmup_steps"):
        plain = re.fullmatch(r"\$\{([\w.]+)\}", str(OmegaConf.to_container(optim)["warmup_steps"]))
        if plain:
            return plain.group(1)
    return "optim.warmup_steps"


def check_warmup(cfg: Any) -> None:
    if "optim.warmup_steps" in (OmegaConf.select(cfg, "hydra.sweeper.params") or {}):
        return  # searched: each trial's value is checked in its own run (a refused trial fails alone)
    warmup, total = OmegaConf.select(cfg, "optim.warmup_steps"), OmegaConf.select(cfg, "stage.total_steps")
    if warmup is None or total is None:
        return
    if not 0 <= int(warmup) <= int(total):
        raise ConfigError(f"{warmup_key(cfg)}={int(warmup)} must be in [0, stage.total_steps={int(total)}]")


def check_accelerator(cfg: Any) -> None:
    """trainer=gpu / ddp / fsdp on a machine without a GPU torch can use: one line, not Lightning's
    traceback from inside the run folder."""
    accelerator = str(OmegaConf.select(cfg, "trainer.accelerator") or "auto").lower()
    if accelerator not in ("gpu", "cuda"):
        return
    import torch

    choice = OmegaConf.select(cfg, "hydra.runtime.choices.trainer") or accelerator
    mps = getattr(torch.backends, "mps", None)
    if accelerator == "gpu" and mps is not None and mps.is_available():
        return
    if not torch.cuda.is_available():
        raise ConfigError(f"trainer={choice} needs a CUDA GPU and torch sees none on this machine "
                          f"(torch {torch.__version__}); use trainer=cpu, or trainer=ddp_cpu for processes on CPU")
    devices = OmegaConf.select(cfg, "trainer.devices")
    if isinstance(devices, int) and devices > torch.cuda.device_count():
        raise ConfigError(f"trainer.devices={devices} but this machine has {torch.cuda.device_count()} CUDA "
                          f"device(s); set trainer.devices=<n>")


def check_inputs(cfg: Any) -> None:
    """The prepared data and the checkpoints a run starts from exist (train() checks them again,
    with their contents, inside the run)."""
    data_metadata(str(cfg.data_dir))
    for key in ("init_from", "ckpt_path"):
        path = cfg.get(key)
        if path and str(path) != "last" and not Path(str(path)).is_file():
            raise CheckpointError(f"{key} checkpoint not found: {path}")


# a logger class (configs/logger/) -> the library it writes through
LOGGER_LIBRARIES = {"TensorBoardLogger": "tensorboard", "WandbLogger": "wandb"}


def check_logger(cfg: Any) -> None:
    """A logger whose library is missing (an installed package without its [loggers] extra): one
    line now, not Hydra's instantiation error from inside the run folder."""
    from anchormass.extras import require

    target = str(OmegaConf.select(cfg, "logger._target_", default="") or "")
    for cls, library in LOGGER_LIBRARIES.items():
        if target.endswith(cls):
            require("loggers", f"logger {target.rsplit('.', 1)[-1]}", [library])


def check_train_launch(cfg: Any) -> None:
    from anchormass.config_checks import check_numbers

    check_logger(cfg)
    check_numbers(cfg, INT_SETTINGS)
    check_warmup(cfg)
    check_accelerator(cfg)
    check_inputs(cfg)
