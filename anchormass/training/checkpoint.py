"""Checkpoint IO: atomic writes, and the one loader everybody uses.

A checkpoint is a Lightning `.ckpt` (docs/architecture.md): `hyper_parameters` holds
`model_config` (ModelConfig.to_dict(), `original_max_len` = longest length trained so far),
`trained_lengths`, `tokenizer_path`, `tokenizer_files` (the tokenizer itself: checkpoint_tokenizer.py)
and `data_fingerprint`; `state_dict` keys are `model.<param>`.

Safety: every read goes through `safe_torch_load` (training/safe_load.py, weights_only=True): a
file holding Python objects other than tensors and plain values is refused before it can run
anything, Lightning's own restore included (`AtomicCheckpointIO.load_checkpoint`).

Integrity: every checkpoint written through `atomic_torch_save` (so every Lightning save, via
AtomicCheckpointIO) carries `content_sha256`, a sha256 over the state_dict and optimizer-state
tensors' bytes (with their names, dtypes and shapes) in key order. `read_checkpoint`, which resume,
`init_from`, evaluation and export all go through, recomputes it and refuses a mismatch in one line.
A checkpoint without the field (written before it existed, or by FSDP's own writer) is accepted
with a one-line warning: refusing would strand every existing run, and its bytes are no less
trustworthy than they were when it was written.
Cost: sha256 runs at ~0.43 GiB/s on the 2-core dev machine (256 MiB of fp32 tensors in 0.58 s), so
a 158M-parameter checkpoint with AdamW state (~1.9 GB) adds ~4-5 s to each save and each load.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from anchormass.errors import CheckpointError
from anchormass.own_files import record, remove_own
from anchormass.training.safe_load import safe_torch_load
from anchormass.utils import atomic_path

STATE_PREFIX = "model."
CHECKSUM_KEY = "content_sha256"
CHECKSUMMED = ("state_dict", "optimizer_states")  # the tensors that are nearly all of a checkpoint's bytes

log = logging.getLogger(__name__)
_warned_unchecked: set[str] = set()


def _hash_tree(h: "hashlib._Hash", name: str, obj: Any) -> None:
    """Feed tensors (name, dtype, shape, raw bytes) and plain scalars into `h`, dict keys sorted."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)  # bf16 too: bytes, not values
    elif isinstance(obj, dict):
        for key in sorted(obj, key=str):
            _hash_tree(h, f"{name}.{key}", obj[key])
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            _hash_tree(h, f"{name}[{i}]", item)
    elif obj is None or isinstance(obj, (bool, int, float, str)):
        h.update(f"{name}={obj!r}\n".encode())


def content_checksum(ckpt: dict) -> str:
    """sha256 over the checkpoint's state_dict and optimizer state (see the module docstring)."""
    h = hashlib.sha256()
    for key in CHECKSUMMED:
        if key in ckpt:
            _hash_tree(h, key, ckpt[key])
    return h.hexdigest()


def tensor_bytes(obj: Any) -> int:
    """Bytes of all tensors in a nested dict/list: about the size torch.save will write."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save through a temp file + os.replace: a reader (or a crash) never sees half a file.

    A checkpoint dict (one with a state_dict) gets its `content_sha256` here, so every save carries
    it; a full disk is one CheckpointError line naming the path and the space needed."""
    if isinstance(obj, dict) and "state_dict" in obj:
        obj = {**obj, CHECKSUM_KEY: content_checksum(obj)}
    with atomic_path(path, error=CheckpointError, needed=lambda: tensor_bytes(obj)) as tmp:
        _save_reporting_os_errors(obj, tmp)


def _save_reporting_os_errors(obj: Any, tmp: Path) -> None:
    """torch.save whose failed write is the OSError itself (ENOSPC: atomic_path's one line).

    Given a path, torch's C++ writer reports a short write as RuntimeError("unexpected pos ...") and
    keeps no errno. Through a Python file the OSError is raised, but once part of the archive is out,
    the writer's closing check replaces it with that same RuntimeError, the OSError as its context.
    Both were seen on this machine's full disk; tests/test_integrity.py reproduces each."""
    with open(tmp, "wb") as fh:
        try:
            torch.save(obj, fh)
        except RuntimeError as err:
            if isinstance(err.__context__, OSError):
                raise err.__context__ from None
            raise


def verify_checksum(ckpt: dict, path: str | os.PathLike) -> None:
    """Refuse a checkpoint whose tensors are not the bytes that were saved; warn (once per file)
    about one that predates the checksum."""
    want = ckpt.get(CHECKSUM_KEY)
    if want is None:
        if str(path) not in _warned_unchecked:
            _warned_unchecked.add(str(path))
            log.warning("checkpoint %s has no content checksum (written before checksums existed); "
                        "loading it unverified", path)
        return
    got = content_checksum(ckpt)
    if got != want:
        raise CheckpointError(f"checkpoint {path} is corrupt: content checksum mismatch (sha256 of its tensors "
                              f"{got[:12]}, saved as {want[:12]}); use another checkpoint (e.g. an earlier "
                              f"step-*.ckpt) or retrain")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO: writes with temp file + os.replace on the local filesystem, reads
    (a resume's restore) with the weights-only unpickler, whatever `weights_only` Lightning passes."""

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        record(Path(path).parent, [Path(path).name])  # before the temp file exists: see anchormass/own_files.py
        atomic_torch_save(checkpoint, path)

    def remove_checkpoint(self, path) -> None:
        """ModelCheckpoint's rotation deletes only checkpoints a run of ours wrote into that folder."""
        remove_own([Path(path)], Path(path).parent)

    def load_checkpoint(self, path, map_location="cpu", weights_only=None) -> dict:
        # "cpu" as Lightning's default (lambda storage, loc: storage) leaves the storages
        return safe_torch_load(path, map_location=map_location)


def read_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict:
    """The raw checkpoint dict; CheckpointError with one line when missing, unreadable, holding
    Python objects (UnsafeCheckpoint) or corrupt (content checksum mismatch). Resume reads it here
    before Lightning loads the file itself."""
    path = Path(path)
    ckpt = safe_torch_load(path, map_location)  # one line for a missing, unreadable or unsafe file
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "hyper_parameters" not in ckpt:
        raise CheckpointError(f"{path} is not an AnchorMass training checkpoint (no state_dict/hyper_parameters)")
    if "model_config" not in ckpt["hyper_parameters"]:
        raise CheckpointError(f"{path}: hyper_parameters lack 'model_config'")
    verify_checksum(ckpt, path)
    return ckpt


def model_state(ckpt: dict) -> dict[str, torch.Tensor]:
    """The model's own state dict (the `model.` prefix of the LightningModule stripped)."""
    return {k[len(STATE_PREFIX):]: v for k, v in ckpt["state_dict"].items() if k.startswith(STATE_PREFIX)}


def load_weights(model: torch.nn.Module, ckpt: dict, path: str | os.PathLike = "<checkpoint>",
                 fresh_start: bool = False) -> None:
    """Copy a checkpoint's weights into `model`; a shape/key mismatch is a CheckpointError.

    fresh_start=True (a run's init_from): the parameters `model.may_start_without()` names may be absent
    from the checkpoint and keep the model's init; every other missing or unexpected key is refused.
    """
    state = model_state(ckpt)
    if fresh_start:
        own = model.state_dict()
        for name in model.may_start_without():
            state.setdefault(name, own[name])
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
