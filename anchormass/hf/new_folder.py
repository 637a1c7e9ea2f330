"""An output folder written whole or not at all: built under a hidden staging name beside it and
renamed into place once complete (exports, imports). The target must be new or empty."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Iterator

from anchormass.errors import ConfigError
from anchormass.own_files import STAGING_MARK, make_staging, remove_staging
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
    if staging.exists() and not remove_staging(staging):  # one a killed build left (own_files.py)
        raise ConfigError(f"{staging} is in the way of {out} and is not a staging folder of ours; move it")
    make_staging(staging)
    try:
        yield staging
        give_usual_modes(staging)  # safetensors and friends leave 0600 files beside 0644 ones
        (staging / STAGING_MARK).unlink()
        if out.exists():
            out.rmdir()  # empty (check_new_folder)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # made by this call
        raise
