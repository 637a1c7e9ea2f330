"""The one way the project opens a `.ckpt` / `.pt` file: torch's weights-only unpickler.

A checkpoint is data. `torch.load(..., weights_only=False)` runs whatever a crafted pickle asks
for (`__reduce__` -> os.system) the moment the file is read, before any check of ours, so every
read goes through `safe_torch_load`: `weights_only=True` rebuilds tensors, dicts, lists, tuples,
sets, str/bytes/int/float/bool/None and torch's own types, and refuses any other Python global.
Resume, `init_from`, evaluation, export, the `ckpt_path=last` folder scan and Lightning's own
restore (AtomicCheckpointIO.load_checkpoint, fit(weights_only=True)) all come here.

A refused file is `UnsafeCheckpoint`, one line naming the first global it holds. Checkpoints
written by earlier versions of the project that hold such objects are converted, by a person
who trusts them, with `scripts/convert_checkpoint.py trust=<file>`: never silently.
"""

from __future__ import annotations

import _compat_pickle
import io
import os
import pickle
import pickletools
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from anchormass.errors import CheckpointError

# The allow-list: Python types beyond torch's own defaults that a checkpoint may hold, each with
# the reason it is needed. Empty, and meant to stay so: the project writes only tensors and plain
# values (hyper-parameters, loop, callback and data-position state; tests/test_checkpoint_safety.py
# reads a checkpoint of the real training path with no other global), and Lightning 2.6.6 adds only
# plain values itself (loops, ModelCheckpoint's paths as str and scores as tensors, precision state).
# A type added here is importable by every checkpoint anybody hands the project: add one only when
# a library we pin needs it, never for convenience, and name why.
SAFE_GLOBALS: dict[type, str] = {}


class UnsafeCheckpoint(CheckpointError):
    """A file the weights-only unpickler refuses: it holds Python objects (code), not data."""

    def __init__(self, path: str | os.PathLike, offending: str):
        self.path, self.offending = Path(path), offending
        super().__init__(f"{path} holds Python objects that a checkpoint must not contain ({offending}); "
                         f"refusing to load it")


_GLOBAL_IN_MESSAGE = re.compile(r"GLOBAL ([\w.]+)")
_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"}


def _pickle_bytes(path: Path) -> bytes:
    """The pickle a torch file unpickles first: data.pkl of a zip checkpoint, else the raw file."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            name = next((n for n in zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
            return zf.read(name) if name else b""
    return path.read_bytes()


def _globals_in(data: bytes) -> list[str]:
    """Every `module.name` the pickle imports, read from its opcodes (nothing is executed)."""
    found, strings = [], []
    try:
        for op, arg, _ in pickletools.genops(io.BytesIO(data)):
            if op.name in _STRING_OPS:
                strings.append(str(arg))
            elif op.name == "GLOBAL":  # "module name", module in Python 2 spelling (torch.save's protocol 2)
                module, _, name = str(arg).partition(" ")
                found.append(f"{_compat_pickle.IMPORT_MAPPING.get(module, module)}.{name}")
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(f"{strings[-2]}.{strings[-1]}")
    except (ValueError, EOFError, pickle.UnpicklingError):  # truncated or not a pickle: what was read so far
        pass
    return found


def _offending_global(path: Path, err: Exception) -> str | None:
    """The first global in the file that torch does not allow (read from its opcodes, as
    `module.name`), else the one torch's message names; None when there is none (random bytes,
    a damaged pickle)."""
    from torch import _weights_only_unpickler as wou  # pinned torch: the names it allows by default

    allowed = set(wou._get_allowed_globals()) | {f"{t.__module__}.{t.__qualname__}" for t in SAFE_GLOBALS}
    try:
        unsafe = [g for g in _globals_in(_pickle_bytes(path)) if g not in allowed]
    except (OSError, zipfile.BadZipFile, KeyError):
        unsafe = []
    named = _GLOBAL_IN_MESSAGE.search(str(err))
    return unsafe[0] if unsafe else named.group(1) if named else None


def safe_torch_load(path: str | os.PathLike, map_location: Any = "cpu", mmap: bool = False) -> Any:
    """torch.load with weights_only=True and only SAFE_GLOBALS allowed beyond torch's defaults.

    mmap=True memory-maps a zip checkpoint (tensors are not read until used); a file in torch's
    old non-zip format cannot be mapped and is read whole, just as safely. UnsafeCheckpoint for a
    file that holds other Python objects, CheckpointError for one that is unreadable."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    mmap = mmap and zipfile.is_zipfile(path)
    try:
        with torch.serialization.safe_globals(list(SAFE_GLOBALS)), warnings.catch_warnings():
            # a crafted raw pickle draws torch's protocol warning; the refusal below is the one line
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        offending = _offending_global(path, err)
        if offending:
            raise UnsafeCheckpoint(path, offending) from None
        reason = next((line.strip() for line in str(err).splitlines() if line.strip().startswith("Unsupported")),
                      "not a pickle")
        raise CheckpointError(f"cannot read checkpoint {path}: not a torch checkpoint ({reason})") from None
    except Exception as err:  # truncated / corrupt / not a torch file
        raise CheckpointError(f"cannot read checkpoint {path}: {type(err).__name__}: {err}") from None
