"""Where `ckpt_path=last` resumes, and a checkpoint folder that stays the run's own when copied or moved.

- The resume point is the checkpoint in `<run folder>/checkpoints/` with the highest step recorded
  inside it (its `global_step`), not the one named `last.ckpt`: a folder copied from another run
  (or one holding an old `last-v1.ckpt`) still resumes from its newest weights. The scan opens each
  file with the weights-only reader (training/safe_load.py), memory-mapped, and skips with one
  `note:` line a file it cannot read, or that holds Python objects a checkpoint must not contain.
- `FolderCheckpoint` is Lightning's ModelCheckpoint that never writes `-vN` copies (it overwrites
  its own file names) and that, restored from a checkpoint made in another folder, maps the kept
  checkpoints it remembers onto its own folder, so it keeps rotating them.
- At the start of a resume, `clean_checkpoint_folder` removes what an interrupted run can leave:
  temp files of an unfinished atomic write and periodic checkpoints beyond the kept count, and
  `make_last_the_newest` makes `last.ckpt` the newest checkpoint again when another name held it.
  Both delete only files a run of ours recorded writing there (anchormass/own_files.py), and
  nothing when `checkpoints/` is a link out of the run folder.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint

from anchormass.errors import CheckpointError
from anchormass.own_files import inside, is_own, remove_own
from anchormass.training.safe_load import UnsafeCheckpoint, safe_torch_load
from anchormass.utils import atomic_path

LAST_PREFIX = "last"  # ModelCheckpoint.CHECKPOINT_NAME_LAST (and an old run's last-vN.ckpt)


def checkpoint_step(path: str | os.PathLike) -> int:
    """The optimizer step a checkpoint holds, read from its content (safely, memory-mapped: the
    tensors are not read). CheckpointError (UnsafeCheckpoint) when it is not a readable checkpoint."""
    ckpt = safe_torch_load(path, mmap=True)
    try:
        return int(ckpt["global_step"])
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{path} is not a training checkpoint (no global_step)") from None


def recorded_step(path: str | os.PathLike) -> int | None:
    """checkpoint_step, or None when the file is not a readable (or not a safe) checkpoint."""
    try:
        return checkpoint_step(path)
    except CheckpointError:
        return None


def _steps(folder: Path) -> dict[Path, int]:
    steps = {}
    for path in sorted(folder.glob("*.ckpt")):
        try:
            steps[path] = checkpoint_step(path)
        except UnsafeCheckpoint as err:
            print(f"note: {path} holds Python objects that a checkpoint must not contain ({err.offending}); "
                  f"ignored", file=sys.stderr)
        except CheckpointError:  # truncated / not a torch file / no global_step: not a resume point
            print(f"note: {path} is not a readable checkpoint; ignored", file=sys.stderr)
    return steps


def latest_checkpoint(folder: str | os.PathLike) -> Path | None:
    """The checkpoint with the highest recorded step in `folder` (on a tie, last.ckpt)."""
    steps = _steps(Path(folder))
    if not steps:
        return None
    return max(steps, key=lambda p: (steps[p], p.name == f"{LAST_PREFIX}.ckpt", p.name))


def clean_checkpoint_folder(folder: str | os.PathLike, keep: int, run_dir: str | os.PathLike,
                            protect: Path | None = None) -> list[Path]:
    """Remove our temp files and all but the `keep` highest-step periodic checkpoints we wrote
    (keep < 0: all), never `protect` (the checkpoint being resumed) nor a file of anyone else, and
    nothing in a folder that is not inside `run_dir` once links are followed. Call only while
    holding the run folder's lock. Returns what was removed."""
    folder = Path(folder)
    if not inside(folder, run_dir):
        return []
    doomed = list(folder.glob("*.tmp"))
    if keep >= 0:
        periodic = {p: s for p, s in _steps(folder).items() if not p.name.startswith(LAST_PREFIX) and is_own(p)}
        ranked = sorted(periodic, key=lambda p: (periodic[p], p.name), reverse=True)
        doomed += [p for p in ranked[keep:] if protect is None or p.resolve() != protect.resolve()]
    return remove_own(doomed, run_dir)


def make_last_the_newest(folder: str | os.PathLike, resume: Path) -> Path:
    """Make `last.ckpt` (what `init_from` and the curriculum read) hold the newest weights when the
    resume point is newer under another name: an old run's `last-vN.ckpt` is renamed onto it, a
    periodic checkpoint copied; leftover `last-vN.ckpt` files no newer than it are removed.
    Returns the resume point's path afterwards. Call only while holding the run folder's lock."""
    folder, resume = Path(folder), Path(resume)
    last = folder / f"{LAST_PREFIX}.ckpt"
    if resume.parent.resolve() != folder.resolve() or resume.name == last.name:
        return resume
    step = recorded_step(resume)
    last_step = recorded_step(last) if last.is_file() else None
    if step is not None and (last_step is None or last_step < step):
        if resume.name.startswith(LAST_PREFIX):
            os.replace(resume, last)
            resume = last
        else:
            with atomic_path(last) as tmp:
                shutil.copyfile(resume, tmp)
        print(f"note: {last} now holds the newest checkpoint (step {step})", file=sys.stderr)
    newest = recorded_step(last) if last.is_file() else None
    for old in folder.glob(f"{LAST_PREFIX}-v*.ckpt"):
        if old != resume and newest is not None and is_own(old) and (recorded_step(old) or 0) <= newest:
            remove_own([old], folder)
            print(f"note: removed {old.name}, an older copy of {last.name}", file=sys.stderr)
    return resume


class FolderCheckpoint(ModelCheckpoint):
    """ModelCheckpoint bound to its own folder: no -vN names, and restored state re-based onto it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["enable_version_counter"] = False
        super().__init__(*args, **kwargs)

    @property
    def state_key(self) -> str:
        # Lightning's own key, so the state in checkpoints written by a plain ModelCheckpoint restores too.
        return ModelCheckpoint.__qualname__ + super().state_key[len(type(self).__qualname__):]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        here = self.dirpath
        if here is None or state_dict.get("dirpath") in (None, here):
            return super().load_state_dict(state_dict)

        def moved(path: str | None) -> str | None:
            return os.path.join(here, os.path.basename(path)) if path else path

        state = dict(state_dict, dirpath=here)
        for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
            state[key] = moved(state.get(key))
        # Only the checkpoints this folder really holds (a move may have left some behind).
        state["best_k_models"] = {moved(p): v for p, v in (state.get("best_k_models") or {}).items()
                                  if os.path.isfile(moved(p))}
        super().load_state_dict(state)
        if self.kth_best_model_path and self.kth_best_model_path not in self.best_k_models and self.best_k_models:
            worst = min if self.mode == "max" else max
            self.kth_best_model_path = worst(self.best_k_models, key=self.best_k_models.get)
            self.kth_value = self.best_k_models[self.kth_best_model_path]
