"""The run-folder layout, stated once: every module that finds or writes a run's files asks here.

A curriculum's runs (curriculum/plan.py) lie at

    <runs_root>/<curriculum>/[seed<s>/]<model>/<stage>/     one run folder per stage
    <runs_root>/<curriculum>/logs/                          the runner's own logs (data preparation, reports)

and a run folder (train.py's `output_dir`, whoever made it) holds

    checkpoints/last.ckpt     the newest weights: what `init_from` and evaluation read
    checkpoints/*.ckpt        periodic checkpoints
    train_result.json         written when a run ends: `completed`, `global_step`, `total_steps`, metrics
    stage_args.json           a curriculum stage's train.py arguments, starting checkpoint, config, data
    logs/                     the CSV logger's metrics.csv (configs/logger/csv.yaml: `name: logs`)

tests/test_run_layout.py refuses these names as string literals anywhere else in the package.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CHECKPOINTS = "checkpoints"
LAST_CHECKPOINT = "last.ckpt"
RESULT_FILE = "train_result.json"
STAGE_ARGS_FILE = "stage_args.json"
LOGS = "logs"


def checkpoints_dir(run: str | os.PathLike) -> Path:
    return Path(run) / CHECKPOINTS


def last_checkpoint(run: str | os.PathLike) -> Path:
    return checkpoints_dir(run) / LAST_CHECKPOINT


def result_file(run: str | os.PathLike) -> Path:
    return Path(run) / RESULT_FILE


def stage_args_file(run: str | os.PathLike) -> Path:
    return Path(run) / STAGE_ARGS_FILE


def logs_dir(folder: str | os.PathLike) -> Path:
    """A run's logger folder, or a curriculum's (the runner's logs beside its runs)."""
    return Path(folder) / LOGS


def run_of_checkpoint(checkpoint: str | os.PathLike) -> Path:
    """<run>/checkpoints/<file>.ckpt -> <run>."""
    return Path(checkpoint).parent.parent


def seed_folder(curriculum_root: Path, seed: int | None) -> Path:
    """Where one training seed's runs lie: `seed<s>/` under the curriculum's folder, or the folder
    itself for a curriculum without seeds."""
    return curriculum_root / f"seed{seed}" if seed is not None else curriculum_root


def stage_folder(seed_root: Path, model: str, stage: str) -> Path:
    return seed_root / model / stage


def seed_folder_of(checkpoint: str | os.PathLike) -> Path:
    """The seed folder a stage's checkpoint lies in: <seed folder>/<model>/<stage>/checkpoints/<file>."""
    return run_of_checkpoint(checkpoint).parent.parent


def finished_run(folder: str | os.PathLike) -> bool:
    """The run in `folder` trained all its steps (its train_result.json records completed: true at
    its total steps; a run stopped on a signal writes completed: false) and left its last checkpoint.
    A run still training has a periodic last.ckpt too, so the checkpoint alone says nothing."""
    path = result_file(folder)
    res = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    return (res.get("completed") is True and res.get("global_step") == res.get("total_steps")
            and last_checkpoint(folder).is_file())
