"""Atomic file writes: a reader never sees a half-written token file, sidecar or tokenizer.

Everything is written to a temp file in the destination folder (same filesystem, so
`os.replace` is atomic) and renamed into place only once complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~_umask()  # mkstemp makes 0600 files; finished outputs get the usual mode


class AtomicFile:
    """A temp file beside `path`: `commit()` fsyncs and renames it to `path`, `discard()` deletes it."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        os.close(fd)
        self.tmp = Path(tmp)

    def commit(self) -> None:
        with open(self.tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(self.tmp, _FILE_MODE)
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        self.tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success it becomes `path`, on error it is deleted."""
    f = AtomicFile(path)
    try:
        yield f.tmp
        f.commit()
    finally:
        f.discard()


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Sorted keys and a fixed layout, so the same content gives byte-identical files."""
    write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"))
