"""Turn a checkpoint that holds Python objects into one the weights-only reader accepts.

Checkpoints written by earlier versions of the project may hold a `DictConfig`, a `Path` or numpy
values in their hyper-parameters, loop or callback state; `safe_torch_load` refuses them. This
reads such a file with the full unpickler (it runs whatever the file asks for: only for a file
the person vouches for, `scripts/convert_checkpoint.py trust=<file>`), replaces those objects
by their plain equivalents and writes the result atomically, checked by the safe reader before it
replaces anything.
"""

from __future__ import annotations

import os
from collections import Counter, OrderedDict
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import torch

from anchormass.errors import CheckpointError, ConfigError
from anchormass.training.checkpoint import CHECKSUM_KEY, atomic_torch_save, verify_checksum
from anchormass.training.safe_load import UnsafeCheckpoint, safe_torch_load


def plain_values(obj: Any, replaced: Counter) -> Any:
    """`obj` with OmegaConf containers, paths and numpy values made plain (dict/list, str, Python
    scalars, tensors); `replaced` counts what was replaced, by type name. Anything else is kept
    (the safe reader then names it)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(obj, (DictConfig, ListConfig)):
        replaced[type(obj).__name__] += 1
        return plain_values(OmegaConf.to_container(obj, resolve=True), replaced)
    if isinstance(obj, PurePath):
        replaced[type(obj).__name__] += 1
        return str(obj)
    if isinstance(obj, np.generic):
        replaced[f"numpy.{type(obj).__name__}"] += 1
        return obj.item()
    if isinstance(obj, np.ndarray):
        replaced["numpy.ndarray"] += 1
        return torch.from_numpy(np.array(obj))
    if type(obj) in (dict, OrderedDict):  # subclasses (defaultdict, namedtuple) are kept: the safe reader names them
        return type(obj)((plain_values(k, replaced), plain_values(v, replaced)) for k, v in obj.items())
    if type(obj) in (list, tuple):
        return type(obj)(plain_values(v, replaced) for v in obj)
    return obj


def convert_trusted(path: str | os.PathLike, out: str | os.PathLike | None = None) -> Counter:
    """Rewrite the trusted checkpoint `path` (into `out`, default in place) with plain values only.
    Returns what was replaced. CheckpointError when it is corrupt or holds an object with no plain
    equivalent; then nothing is written."""
    path = Path(path)
    out = Path(out) if out is not None else path
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        raw = torch.load(path, map_location="cpu", weights_only=False)  # trust=: the person vouches for it
    except Exception as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {type(err).__name__}: {err}") from None
    if isinstance(raw, dict) and CHECKSUM_KEY in raw:
        verify_checksum(raw, path)  # converting a corrupt file would give it a fresh, valid checksum
    replaced: Counter = Counter()
    plain = plain_values(raw, replaced)
    if isinstance(plain, dict):
        plain.pop(CHECKSUM_KEY, None)  # recomputed over the converted tensors by atomic_torch_save
    staged = out.with_name(f".{out.name}.convert.tmp")  # a *.tmp: a resume's folder cleaning removes a leftover
    atomic_torch_save(plain, staged)
    try:
        safe_torch_load(staged, mmap=True)
    except UnsafeCheckpoint as err:
        staged.unlink(missing_ok=True)
        raise CheckpointError(f"cannot convert {path}: it holds {err.offending}, which has no plain equivalent "
                              f"here; nothing was written") from None
    os.replace(staged, out)
    return replaced


def convert_command(trust: str | None, out: str | None = None) -> None:
    """scripts/convert_checkpoint.py: convert the file named with trust= and say what was replaced."""
    if not trust:
        raise ConfigError("trust=<file> is required: the checkpoint you trust to unpickle "
                          "(python scripts/convert_checkpoint.py trust=<file> [out=<file>])")
    trust, out = Path(str(trust)), Path(str(out)) if out else None
    replaced = convert_trusted(trust, out)
    what = ", ".join(f"{n} {kind}" for kind, n in sorted(replaced.items())) or "nothing to replace"
    print(f"converted {trust} -> {out or trust} ({what})")
