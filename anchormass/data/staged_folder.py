"""A dataset folder built in a staging folder beside its target and renamed into place at the end, so
a failure leaves no partial output and an existing folder is replaced only by a complete one. One
build per target at a time (a lock beside it); staging folders that a killed build left behind are
removed by the next one. prepare.py and merge.py build their folders here."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from anchormass.data.dataset_dir import PreparedDataset
from anchormass.data.shards import SHARD_KIND, ShardReader
from anchormass.dir_lock import DirLock
from anchormass.errors import ConfigError
from anchormass.own_files import STAGING_MARK, remove_staging
from anchormass.utils import atomic_write_json, current_umask, writable_dir


def build_folder(out: Path, build: Callable[[Path], dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """`build(staging)` writes a folder's files and returns its meta.json; the folder is then
    checked and renamed to `out` (replacing the old one), under `out`'s lock. Returns (out, meta)."""
    # The folder is replaced wholesale at the end: never a file, nor a folder that is not a dataset.
    if out.exists() and not (out.is_dir() and ((out / "meta.json").is_file() or not any(out.iterdir()))):
        raise ConfigError(f"out_dir {out} exists and is not a prepared dataset folder; refusing to replace it")
    writable_dir(out.parent, f"data.out_dir={out}: its folder")
    with DirLock(out.parent / f".{out.name}.lock", what=f"dataset folder {out}"):
        return _build_locked(out, build)


def _remove_leftovers(out: Path) -> None:
    """Staging and replaced folders of this target: while we hold its lock no other prepare is
    writing one, so any that exist were left by a prepare that was killed. Each is removed only
    when it proves itself ours (anchormass/own_files.py): a staging folder by its mark, a replaced
    one by its mark or by being a prepared dataset (renamed aside, then killed before its removal)."""
    for path in out.parent.glob(f".{out.name}.staging-*"):
        remove_staging(path)
    for path in out.parent.glob(f".{out.name}.old-*"):
        if (path / "meta.json").is_file() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            remove_staging(path)


def _build_locked(out: Path, build: Callable[[Path], dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    _remove_leftovers(out)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
    (staging / STAGING_MARK).write_bytes(b"")  # a kill before this leaves an empty folder
    t0 = time.perf_counter()
    try:
        meta = build(staging)
        atomic_write_json(staging / "meta.json", meta, sort_keys=True, indent=2)
        (ShardReader if meta["kind"] == SHARD_KIND else PreparedDataset)(staging)  # re-open, check all we wrote
        os.chmod(staging, 0o777 & ~current_umask())  # mkdtemp makes it 0700
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        if out.exists():
            os.replace(out, old)  # a prepared dataset or an empty folder (checked by build_folder)
        (staging / STAGING_MARK).unlink()
        os.replace(staging, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        remove_staging(staging)
    meta["seconds"] = round(time.perf_counter() - t0, 2)  # reported, not written (files stay identical)
    return out, meta
