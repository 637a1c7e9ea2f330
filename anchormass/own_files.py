"""What the project may delete: only files it can prove it wrote.

A folder the project writes into on a user's behalf (a run's `checkpoints/`, an evaluation's
`out_dir`) holds a record, `RECORD`, of the names written there. A name is recorded before its
file (or the temp file of its atomic write) is made, so a process killed at any instant leaves
nothing of its own unrecorded. A file whose name is not recorded, whatever it is called (a user's
`backup_step2.ckpt` or `notes.tmp` beside the checkpoints), is never deleted; nor is anything
reached through a symbolic link that leaves the folder being cleaned.

A staging folder (an output built beside its target) carries `STAGING_MARK` from the moment it is
made until `publish_staging` swaps the mark for a record of every file in it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable

from anchormass.utils import atomic_write_text

RECORD = ".anchormass_files"  # one name a line, relative to the folder holding the record
# In a folder the project made for its own work in progress (an output built beside its target,
# renamed into place when complete): everything in it is the project's until it is published.
STAGING_MARK = ".anchormass_staging"


def _record_lines(folder: str | os.PathLike) -> list[str]:
    try:
        text = (Path(folder) / RECORD).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line]


def recorded(folder: str | os.PathLike) -> set[str]:
    """The names recorded in `folder` (none when it has no record). A line cut short by a kill
    names no file the project wrote, so it matches nothing."""
    return set(_record_lines(folder))


def forget(folder: str | os.PathLike, names: Iterable[str]) -> None:
    """Drop deleted files' names from the record, so a file a user puts there later under the same
    name is not taken for ours (rewritten atomically: a kill leaves the old record or the new one)."""
    gone, lines = set(names), _record_lines(folder)
    if gone & set(lines):
        atomic_write_text(Path(folder) / RECORD, "".join(f"{n}\n" for n in lines if n not in gone))


def record(folder: str | os.PathLike, names: Iterable[str]) -> None:
    """Add `names` to `folder`'s record (made with the folder if needed), on disk before returning:
    call it before writing the files."""
    folder = Path(folder)
    new = [n for n in dict.fromkeys(names) if n not in recorded(folder)]
    if not new:
        return
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / RECORD, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, "".join(f"{n}\n" for n in new).encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def is_temp_of(name: str, target: str) -> bool:
    """`name` is the temp file of an atomic write of `target` (utils.AtomicFile: `.<target>.<random>.tmp`)."""
    return name.startswith(f".{target}.") and name.endswith(".tmp")


def is_named(name: str, names: set[str]) -> bool:
    """`name` (relative to the record's folder) is recorded, or is the temp file of a recorded name."""
    if name in names:
        return True
    parent, _, base = name.rpartition("/")
    return any(is_temp_of(base, n.rpartition("/")[2]) for n in names if n.rpartition("/")[0] == parent)


def is_own(path: str | os.PathLike) -> bool:
    """`path` is a plain file whose name its folder's record holds, or the temp file of one."""
    path = Path(path)
    return not path.is_symlink() and path.is_file() and is_named(path.name, recorded(path.parent))


def inside(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """`path`, its symbolic links followed, lies in `root` (itself included)."""
    return Path(path).resolve().is_relative_to(Path(root).resolve())


def remove_own(paths: Iterable[Path], root: str | os.PathLike) -> list[Path]:
    """Delete those of `paths` that are the project's own and lie in `root` (no link followed out
    of it); returns what was deleted."""
    removed = []
    for path in paths:
        if is_own(path) and inside(path.parent, root):
            path.unlink(missing_ok=True)
            forget(path.parent, [path.name])
            removed.append(path)
    return removed


def entries(folder: Path) -> list[str]:
    """Every file and folder under `folder` (links not followed), as relative names, the record left out."""
    out = []
    for base, dirs, files in os.walk(folder):
        rel = Path(base).relative_to(folder)
        out += [(rel / name).as_posix() for name in dirs + files]
    return sorted(n for n in out if n != RECORD)


def foreign(folder: str | os.PathLike) -> list[str]:
    """What `folder` holds that its record does not name (links to files or folders count as foreign)."""
    folder = Path(folder)
    names = recorded(folder)
    return [n for n in entries(folder) if not is_named(n, names) or (folder / n).is_symlink()]


def remove_own_folder(folder: str | os.PathLike) -> None:
    """Delete `folder` when it holds only what its record names, or nothing (call `foreign` first
    to say why not); refuses (OSError) a link or anything foreign, deleting nothing."""
    folder = Path(folder)
    if folder.is_symlink() or foreign(folder):
        raise OSError(f"{folder} holds files the project did not write; not deleting it")
    names = entries(folder)
    for name in reversed(names):  # files before the folders holding them
        path = folder / name
        if path.is_dir():
            path.rmdir()
        else:
            path.unlink()
    (folder / RECORD).unlink(missing_ok=True)
    folder.rmdir()


def make_staging(folder: Path) -> Path:
    """A new folder for work in progress, marked as the project's (a kill between the two leaves an
    empty folder, which anyone may remove)."""
    folder.mkdir(parents=True)
    (folder / STAGING_MARK).write_bytes(b"")
    return folder


def is_removable_staging(folder: Path) -> bool:
    """`folder` is a staging folder of ours (marked, or recorded in full) or empty, and no link."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    return (folder / STAGING_MARK).is_file() or not foreign(folder)


def remove_staging(folder: Path) -> bool:
    """Delete a staging folder left by an earlier (killed or failed) build; False, deleting nothing,
    when `folder` is not one (rmtree never follows the links inside it)."""
    if not is_removable_staging(folder):
        return False
    shutil.rmtree(folder)
    return True


def publish_staging(folder: Path) -> None:
    """The staging folder is complete: record every file in it, then drop the mark."""
    record(folder, [n for n in entries(folder) if n != STAGING_MARK])
    (folder / STAGING_MARK).unlink()
