"""Where an exported folder came from: the source checkpoint's sha256 and the git commit."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from anchormass.utils import atomic_write_json, code_version, sha256_file

PROVENANCE_FILE = "anchormass_export.json"


def write_provenance(out_dir: Path, ckpt_path: Path, arch: str, extra: dict | None = None) -> dict:
    """Write `anchormass_export.json` into `out_dir` and return what it holds."""
    info = {"source_checkpoint": str(Path(ckpt_path).resolve()), "source_sha256": sha256_file(ckpt_path),
            "git_commit": code_version(), "arch": arch,
            "exported": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), **(extra or {})}
    atomic_write_json(Path(out_dir) / PROVENANCE_FILE, info)
    return info
