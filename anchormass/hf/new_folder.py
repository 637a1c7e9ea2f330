"""An output folder written whole or not at all: built under a hidden staging name beside it and
renamed into place once complete (exports, imports). The target must be new or empty."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Iterator

from anchormass.errors import ConfigError
from anchormass.utils import give_usual_modes, writable_dir


def check_new_folder(out: Path, what: str = "out") -> None:
    """`out` may be written: it does not exist or is an empty folder, and its parent is writable."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{what} {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"{what} {out} already exists and is not empty; choose a new folder")
    writable_dir(out.parent, f"{what}={out}: its folder")


@contextlib.contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """Yield an empty staging folder; on success it becomes `out`, on any error it is removed."""
    staging = out.parent / f".{out.name}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        yield staging
        give_usual_modes(staging)  # safetensors and friends leave 0600 files beside 0644 ones
        if out.exists():
            out.rmdir()  # empty (check_new_folder)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
