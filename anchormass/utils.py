"""Small helpers every part of the package shares; this module imports only `anchormass.errors`.

- where the configs are (`CONFIG_ROOT`, `CHECKOUT`) and the one rule for relative paths (`resolve_path`),
- atomic file writes: a reader never sees a half-written token file, checkpoint, report or sidecar
  (temp file in the destination folder, fsync, then `os.replace`, which is atomic on one filesystem);
  a full disk (ENOSPC) is one line naming the path and the space needed, the temp file removed and
  the previous file untouched (`disk_full_as`),
- checksums and the code's provenance (git commit with a dirty flag).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib.resources
import json
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from anchormass.errors import AnchorMassError


def find_checkout() -> Path | None:
    """The source checkout this package is imported from (run in place or `pip install -e .`),
    None when it is an installed copy (`pip install .`: site-packages has no configs/ beside it)."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "configs" / "train.yaml").is_file() and (root / "pyproject.toml").is_file() else None


CHECKOUT = find_checkout()
# One source of truth: the checkout's configs/, which the wheel ships as anchormass/configs/
# (setup.py maps the folder into the package). A real folder either way, as Hydra needs.
CONFIG_ROOT = (CHECKOUT / "configs" if CHECKOUT is not None
               else Path(str(importlib.resources.files("anchormass").joinpath("configs"))))


def resolve_path(path: str | os.PathLike) -> Path:
    """The one rule for a relative path, in every command, checkout or installed: it is taken from
    the folder the command runs in (as Hydra takes runs/...), read when the path is resolved;
    an absolute path is kept as given."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path.cwd() / p


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_FILE_MODE = 0o666 & ~current_umask()  # mkstemp makes 0600 files; finished outputs get the usual mode


def give_usual_modes(folder: str | os.PathLike) -> None:
    """Every file under `folder` gets the mode the umask gives a new file: libraries that write
    through a private temp file (safetensors) leave 0600 beside 0644 files in one output."""
    for path in Path(folder).rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(_FILE_MODE)


def writable_dir(path: str | os.PathLike, what: str) -> Path:
    """Create folder `path` (parents too) and prove it writable now, not after the work that will
    write there: one line naming `what` otherwise (read-only, under a file, no permission)."""
    from anchormass.errors import ConfigError

    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write_probe-{os.getpid()}"  # per process: two launches may probe at once
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"{what} {path} is not writable: {err.strerror or err}") from None
    return path


def format_bytes(n: int) -> str:
    """`12,582,912 bytes (12.6 MB)`: the exact count and a readable size (decimal units)."""
    unit, scale = next(((u, s) for u, s in (("TB", 1e12), ("GB", 1e9)) if n >= s), ("MB", 1e6))
    return f"{n:,} bytes ({n / scale:.1f} {unit})"


def free_bytes(path: str | os.PathLike) -> int | None:
    """Free space on the filesystem holding `path` (its nearest existing parent), None if unknown."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def disk_full_message(path: str | os.PathLike, needed: int | None, at_least: bool = False) -> str:
    """One line for ENOSPC: which path, how much it needed, how much is free, and what to do."""
    need = "unknown space" if needed is None else ("at least " if at_least else "about ") + format_bytes(needed)
    free = free_bytes(path)
    free_text = "" if free is None else f", {format_bytes(free)} free"
    return (f"no space left on device writing {path} ({need} needed{free_text}); nothing was "
            f"replaced and no temp file is left: free some space (or write elsewhere) and re-run")


def is_disk_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT)


@contextlib.contextmanager
def disk_full_as(error: type[AnchorMassError], path: str | os.PathLike,
                 needed: int | Callable[[], int | None] | None = None, at_least: bool = False) -> Iterator[None]:
    """ENOSPC (or a quota) inside the block becomes `error(disk_full_message(...))`, one line;
    `needed` may be a callable, evaluated only when the disk is full. The caller cleans up."""
    try:
        yield
    except OSError as err:
        if not is_disk_full(err):
            raise
        raise error(disk_full_message(path, needed() if callable(needed) else needed, at_least)) from None


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

    def written(self) -> int:
        """Bytes in the temp file so far (0 once it is committed or discarded)."""
        try:
            return self.tmp.stat().st_size
        except OSError:
            return 0


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, *, error: type[AnchorMassError] = AnchorMassError,
                needed: int | Callable[[], int | None] | None = None) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success it becomes `path`, on error it is deleted.

    A full disk is `error` with one line (`disk_full_message`); without `needed` it reports what
    the temp file held when the write failed, as a lower bound."""
    with disk_full_as(error, path, needed):
        f = AtomicFile(path)
    at_least = needed is None
    try:
        with disk_full_as(error, path, needed if needed is not None else f.written, at_least):
            yield f.tmp
            f.commit()
    finally:
        f.discard()


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    with atomic_path(path, needed=len(data)) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def jsonable(obj: Any) -> Any:
    """NaN/inf are not JSON: store them as strings; numpy / torch scalars become Python numbers."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, Path):
        return str(obj)
    return obj


def atomic_write_json(path: str | os.PathLike, obj: Any, *, sort_keys: bool = False, indent: int = 1) -> Path:
    """JSON via `jsonable`; `sort_keys=True, indent=2` gives byte-identical files for equal content."""
    text = json.dumps(jsonable(obj), ensure_ascii=False, indent=indent, sort_keys=sort_keys)
    return atomic_write_text(path, text + "\n")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


# Untracked files with these endings are code or config that can change a result; others
# (notes, scratch output outside .gitignore) do not make a tree dirty.
SOURCE_SUFFIXES = (".py", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".sh", ".json", ".txt")


# What the project's own commands write into a checkout: results, not code. An untracked file
# there (an export's config.json, a run's .hydra/config.yaml, a dataset's meta.json) must not
# mark every later result "-dirty", whether or not the folder is in .gitignore.
OUTPUT_FOLDERS = ("exports", "runs", "multirun", "outputs", "data", "wandb", "lightning_logs")
# A folder holding one of these files was written by train.py / evaluate.py / export_hf.py /
# prepare_data.py wherever it was pointed (hydra.run.dir=..., out=..., data.out_dir=...).
OUTPUT_MARKERS = (".hydra", "train_result.json", "results.json", "anchormass_export.json", "meta.json",
                  ".run.lock")


def is_project_output(root: str | os.PathLike, relpath: str) -> bool:
    """Whether the untracked file `relpath` (relative to `root`) lies in a project output folder."""
    parts = Path(relpath).parts
    if len(parts) > 1 and parts[0] in OUTPUT_FOLDERS:
        return True
    folder = Path(root)
    for part in parts[:-1]:
        folder = folder / part
        if any((folder / marker).exists() for marker in OUTPUT_MARKERS):
            return True
    return False


def git_state(root: str | os.PathLike | None = CHECKOUT) -> dict | None:
    """{'commit', 'dirty', 'modified', 'untracked_source'} of the checkout at `root`, or None
    outside git or without a checkout (an installed package: not the git state of whatever folder
    it runs in): dirty when a tracked file changed or an untracked (not ignored) source file
    exists, since either can make the code differ from the commit."""
    if root is None:
        return None
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root,
                                capture_output=True, text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    if not sha:
        return None
    modified = [line[3:] for line in status if not line.startswith("??")]
    untracked = [line[3:] for line in status if line.startswith("??") and line.rstrip().endswith(SOURCE_SUFFIXES)
                 and not is_project_output(root, line[3:].strip().strip('"'))]
    return {"commit": sha, "dirty": bool(modified or untracked), "modified": len(modified),
            "untracked_source": untracked}


def git_commit(root: str | os.PathLike | None = CHECKOUT) -> str | None:
    """The commit of the code that produced a result (+'-dirty' as `git_state` defines it)."""
    state = git_state(root)
    if state is None:
        return None
    return state["commit"] + ("-dirty" if state["dirty"] else "")


def code_version(root: str | os.PathLike | None = CHECKOUT) -> str:
    """What produced a result, as every report and log says it: the git commit in a checkout, else
    the installed package's version (never None: "no commit" would read as an unknown origin)."""
    import anchormass

    return git_commit(root) or f"anchormass {anchormass.__version__} (installed, no checkout)"
