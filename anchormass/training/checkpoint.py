"""Checkpoint IO: atomic writes, and the one loader everybody uses.

A checkpoint is a Lightning `.ckpt` (docs/architecture.md): `hyper_parameters` holds
`model_config` (ModelConfig.to_dict(), `original_max_len` = longest length trained so far),
`trained_lengths`, `tokenizer_path` and `data_fingerprint`; `state_dict` keys are `model.<param>`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from anchormass.errors import CheckpointError
from anchormass.utils import REPO_ROOT, atomic_path

STATE_PREFIX = "model."


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save through a temp file + os.replace: a reader (or a crash) never sees half a file."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, with temp file + os.replace on the local filesystem."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        atomic_torch_save(checkpoint, path)


def read_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict:
    """The raw checkpoint dict; CheckpointError with one line when missing or unreadable."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        # Our own files: they hold optimizer/loop state and plain-python hparams.
        ckpt = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as err:  # corrupt / truncated / not a torch file
        raise CheckpointError(f"cannot read checkpoint {path}: {type(err).__name__}: {err}") from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "hyper_parameters" not in ckpt:
        raise CheckpointError(f"{path} is not an AnchorMass training checkpoint (no state_dict/hyper_parameters)")
    if "model_config" not in ckpt["hyper_parameters"]:
        raise CheckpointError(f"{path}: hyper_parameters lack 'model_config'")
    return ckpt


def model_state(ckpt: dict) -> dict[str, torch.Tensor]:
    """The model's own state dict (the `model.` prefix of the LightningModule stripped)."""
    return {k[len(STATE_PREFIX):]: v for k, v in ckpt["state_dict"].items() if k.startswith(STATE_PREFIX)}


def load_weights(model: torch.nn.Module, ckpt: dict, path: str | os.PathLike = "<checkpoint>") -> None:
    """Copy a checkpoint's weights into `model`; a shape/key mismatch is a CheckpointError."""
    state = model_state(ckpt)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        first = str(err).strip().splitlines()
        detail = " ".join(line.strip() for line in first[:3])
        raise CheckpointError(f"{path} does not fit the model: {detail}") from None


def load_model(path: str | os.PathLike, map_location: Any = "cpu") -> tuple[torch.nn.Module, dict]:
    """Rebuild the model a training checkpoint describes and load its weights (eval mode).

    Returns (model, hparams); hparams is the checkpoint's `hyper_parameters` dict
    (`model_config`, `trained_lengths`, `tokenizer_path`, `data_fingerprint`, ...).
    """
    from anchormass.models import build_model
    from anchormass.models.config import ModelConfig

    ckpt = read_checkpoint(path, map_location)
    hparams = dict(ckpt["hyper_parameters"])
    model = build_model(ModelConfig.from_dict(hparams["model_config"]))
    load_weights(model, ckpt, path)
    model.to(map_location if isinstance(map_location, (str, torch.device)) else "cpu")
    model.eval()
    return model, hparams


def stored_path(path: str | os.PathLike) -> Path:
    """A path a checkpoint stored: relative to the checkout it was trained in (e.g. data/demo/...)."""
    path = Path(path)
    if path.is_absolute() or path.exists():
        return path
    alt = REPO_ROOT / path
    return alt if alt.exists() else path


def check_tokenizer(tok, hparams: dict, vocab_size: int, label: str) -> None:
    """Refuse a tokenizer other than the one the checkpoint was trained with (by checksum), or one
    with more ids than the model's vocabulary."""
    want = hparams.get("tokenizer_checksum")
    if want and want != tok.checksum:
        raise CheckpointError(f"tokenizer {tok.path} (sha256 {tok.checksum[:12]}) is not the one model '{label}' "
                              f"was trained with ({want[:12]}); pass tokenizer=<the right file>")
    if tok.vocab_size > vocab_size:
        raise CheckpointError(f"tokenizer {tok.path} has {tok.vocab_size} ids but model '{label}' only "
                              f"{vocab_size}: tokenizer and checkpoint do not match")
