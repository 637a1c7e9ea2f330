"""A run folder belongs to one run.

- While a run trains, it holds a lock on its folder: a second launch into the same folder is
  refused in one line naming the holder (anchormass/dir_lock.py); a lock left by a killed run is
  taken over.
- A fresh run (no `ckpt_path`) into a folder that already holds checkpoints is refused: Lightning
  would write `last-v1.ckpt` beside the old `last.ckpt`, and the next stage's `init_from` (which
  reads `last.ckpt`) would silently start from the old weights. `ckpt_path=last` continues the old
  run; `overwrite=true` deletes what the old run wrote first, as far as the records of the folder
  and of its checkpoints/ name it (anchormass/own_files.py): a file a user put there is refused.

Only the process that starts a run claims its folder: the other ranks of a multi-process run
(Lightning's DDP children, Slurm tasks, torchrun workers) share the claim of rank 0.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
from pathlib import Path

from anchormass.dir_lock import DirLock
from anchormass.errors import ConfigError
from anchormass.own_files import foreign, record, recorded, remove_own_folder
from anchormass.runs.layout import CHECKPOINTS, LOGS, RESULT_FILE, checkpoints_dir

LOCK_FILE = ".run.lock"
WANDB_ID_FILE = "wandb_run_id"
# What a run writes into its folder besides Hydra's own records (.hydra/, <job>.log): removed
# by overwrite=true, and only where the folder's record names them (a run of ours claimed it).
# A fixed list, never "everything", because a run folder may be any folder.
RUN_OUTPUTS = (CHECKPOINTS, RESULT_FILE, LOGS, "tensorboard", "wandb", WANDB_ID_FILE)
# Environment variables that mark a process as a non-zero rank of a multi-process run.
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID")

_held: dict[Path, DirLock] = {}


def is_launching_process() -> bool:
    return all(os.environ.get(name, "0") == "0" for name in RANK_VARIABLES)


def checkpoints_in(folder: Path) -> list[Path]:
    return sorted(checkpoints_dir(folder).glob("*.ckpt"))


def claim(folder: str | os.PathLike, resume: bool, overwrite: bool) -> None:
    """Lock `folder` for this process's run and make sure no earlier run's files mix with it."""
    if not is_launching_process():
        return
    folder = Path(folder).resolve()
    lock = _held.get(folder)
    if lock is None:
        lock = DirLock(folder / LOCK_FILE, what=f"run folder {folder}").acquire()
        _held[folder] = lock
        if lock.previous:
            print(f"note: {folder} was left locked by a run that did not finish ({lock.describe_previous()}); "
                  f"taking it over", file=sys.stderr)
    if resume:
        record(folder, RUN_OUTPUTS)  # a run of ours goes on here: what it writes is its own
        return
    old = checkpoints_in(folder)
    if old and not overwrite:
        release(folder)
        raise ConfigError(f"{folder} already holds another run's checkpoints ({len(old)}, e.g. {old[-1].name}); "
                          f"continue it with ckpt_path=last, replace it with overwrite=true, or use another folder")
    # A fresh run starts from a clean folder: even without checkpoints, an old train_result.json
    # would tell the curriculum this stage is already done. Only what a run of ours recorded
    # writing goes (anchormass/own_files.py): the folder's own record names the outputs, the
    # checkpoints folder's record each checkpoint; anything else is refused, deleting nothing.
    checkpoints = checkpoints_dir(folder)
    ours = recorded(folder)
    present = [name for name in RUN_OUTPUTS if (folder / name).exists() or (folder / name).is_symlink()]
    others = [name for name in present if name not in ours and not (folder / name).is_symlink()]
    if checkpoints.is_dir() and not checkpoints.is_symlink():
        others = [n for n in others if n != CHECKPOINTS] + [f"{CHECKPOINTS}/{n}" for n in foreign(checkpoints)]
    if others:
        release(folder)
        raise ConfigError(f"{folder} holds {', '.join(others[:3])}{', ...' if len(others) > 3 else ''}, which no run "
                          f"of this project recorded writing; move them elsewhere (or delete them, if an earlier "
                          f"version's run wrote them), or use another folder")
    for name in present:
        path = folder / name
        if path.is_symlink():
            path.unlink()  # a link is removed, never what it points to
        elif path == checkpoints:
            remove_own_folder(path)
        elif path.is_dir():
            shutil.rmtree(path)  # a logger's folder that a run of ours recorded making
        else:
            path.unlink()
    record(folder, RUN_OUTPUTS)  # before the run makes any of them


def release(folder: str | os.PathLike) -> None:
    lock = _held.pop(Path(folder).resolve(), None)
    if lock is not None:
        lock.release()


@atexit.register
def _release_all() -> None:
    # A process that exits normally never leaves a lock that looks like a crashed run's.
    for folder in list(_held):
        release(folder)
