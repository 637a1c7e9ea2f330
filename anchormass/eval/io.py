"""Small file helpers for evaluation outputs: atomic writes, checksums, provenance."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
from pathlib import Path
from typing import Any

from anchormass.data import atomic

REPO_ROOT = Path(__file__).resolve().parents[2]


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Temp file in the same folder, then rename: readers never see half a file."""
    atomic.write_bytes(path, data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def _jsonable(obj: Any) -> Any:
    """NaN/inf are not JSON: store them as strings; numpy / torch scalars become Python numbers."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, Path):
        return str(obj)
    return obj


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    text = json.dumps(_jsonable(obj), ensure_ascii=False, indent=1)
    return atomic_write_text(path, text + "\n")


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def git_commit() -> str | None:
    """The commit of the code that produced a result (+'-dirty' when the tree has changes)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    if not sha:
        return None
    return sha + ("-dirty" if dirty else "")
