"""Stages that start from a checkpoint file the recipe names (`init_from: {retro_1k: imports/smollm2/model.ckpt}`,
recipe.py) instead of another stage's run: an imported model, which no stage of the plan trains.

The plan gives such a run no parent, so it waits for no other chain, and passes `init_across_arch=true`
(plan.train_args; train.py still refuses any other difference of shape, and data of another tokenizer,
in one line). What a parent stage gives for free is done here:

- the file is there before anything trains (`check_start_files`, called by runner.py before any data
  is prepared), not found missing by the stage hours later. Not when a recipe is only planned (tests, a
  clone without the import) nor for a stage that is finished or resumes its own checkpoint: none reads it;
- the file's sha256 is part of the stage's record (execute.stage_record) and a rerun compares it with
  the file's now (changes.py), so a stage whose file was replaced (imported again, other weights) is a
  changed stage, refused or retrained like one whose config changed. A parent stage needs no such
  record: it is a stage of the plan, compared itself, and a retrained one retrains what starts from it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from anchormass.errors import ConfigError
from anchormass.runs.run_dir import checkpoints_in
from anchormass.runs.stage_console import shown
from anchormass.utils import sha256_file

RECORD_KEY = "start_file"  # in stage_args.json: {"path", "sha256"} of the file the stage started from, or null


def file_sha256(path: Path) -> str | None:
    """The file's sha256, None when it cannot be read."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return _sha256(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _sha256(path: str, size: int, mtime_ns: int) -> str | None:
    """Once per version of the file: a 135M-parameter checkpoint is about 0.5 GB, and every stage that
    starts from it is compared on each rerun."""
    try:
        return sha256_file(path)
    except OSError:
        return None


def start_record(path: Path | None) -> dict | None:
    """What a stage's record keeps of its start file (None: it starts from no file)."""
    return None if path is None else {"path": str(path), "sha256": file_sha256(path)}


def start_differences(record: dict, run) -> list[str]:
    """How the start file of `run` (a StageRun) differs from the one its record names."""
    before = record.get(RECORD_KEY) if isinstance(record.get(RECORD_KEY), dict) else None
    if run.start_file is None:
        now = shown(run.init_from) if run.init_from else "scratch"
        return [f"it started from file {before.get('path')}, now from {now}"] if before else []
    if before is None:
        return [f"it started from {record.get('init_from') or 'scratch'}, now from file {shown(run.start_file)}"]
    now = file_sha256(run.start_file)
    if now != before.get("sha256"):
        return [f"start file {shown(run.start_file)}: sha256 {str(before.get('sha256'))[:12]} -> "
                f"{now[:12] if now else 'not readable'}"]
    return []


def check_start_files(runs: list) -> None:
    """Refuse in one line a stage (a StageRun) that is to start from a file that is not there: train.py
    would refuse it too, but only when its chain reaches it."""
    for run in runs:
        if run.start_file is None or run.shared_from is not None or run.is_done() or checkpoints_in(run.out_dir):
            continue
        if not run.start_file.is_file():
            raise ConfigError(f"{run.model}'s stage {run.stage} starts from {shown(run.start_file)}, which is not a "
                              f"file; make it first (e.g. scripts/import_hf.py out=<folder>) or correct the "
                              f"recipe's init_from")
