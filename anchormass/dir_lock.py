"""A folder used by one process at a time: an exclusive lock on a lock file, with the holder's
pid, host and start time written inside so that a refused process can say who holds it.

The lock is an `flock` on the open file, so the kernel drops it when the holder exits in any way
(crash, SIGKILL, lost node): a lock file left behind by a dead process does not block anyone, and
the next process takes it over. A clean release deletes the file; finding one that nobody holds
therefore means its last holder died while holding it.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from anchormass.errors import ConfigError


class FolderBusy(ConfigError):
    """Another live process holds the lock."""


def _describe(holder: dict) -> str:
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {when}"


def _read_holder(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = os.read(fd, 4096)
    try:
        holder = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (UnicodeDecodeError, json.JSONDecodeError):
        holder = {"pid": "?", "host": "unreadable lock file"}
    return holder if isinstance(holder, dict) else {}


class DirLock:
    """`with DirLock(path, what="run folder runs/x"):` or acquire()/release().

    acquire() raises FolderBusy (one line, naming the holder) when a live process holds it.
    `previous` is the holder record of a dead process whose lock was taken over, else None.
    """

    def __init__(self, lock_file: str | os.PathLike, what: str):
        self.lock_file = Path(lock_file)
        self.what = what
        self.previous: dict | None = None
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _open_locked(self) -> int:
        """An fd holding the flock of the file now at lock_file. A file we opened may be deleted
        by its releasing holder before our flock lands; a lock on that orphan would exclude
        nobody, so then try again on the new file."""
        while True:
            try:
                self.lock_file.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as err:
                raise ConfigError(f"cannot create the lock file of {self.what}: {err.strerror or err}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                same = os.path.samestat(os.fstat(fd), os.stat(self.lock_file))
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise FolderBusy(f"{self.what} is in use by another process ({_describe(holder)}); "
                                 f"wait for it to finish or use another folder") from None
            except FileNotFoundError:
                same = False
            except OSError as err:  # e.g. a network filesystem mounted without lock support
                os.close(fd)
                raise ConfigError(f"cannot lock {self.what} ({self.lock_file}): {err.strerror or err}") from None
            except BaseException:
                os.close(fd)
                raise
            if same:
                return fd
            os.close(fd)

    def acquire(self) -> "DirLock":
        if self._fd is not None:
            return self
        fd = self._open_locked()
        self.previous = _read_holder(fd) or None
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode("utf-8"), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def describe_previous(self) -> str:
        return _describe(self.previous or {})

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            self.lock_file.unlink(missing_ok=True)  # gone = released cleanly (see the module docstring)
        finally:
            os.close(fd)  # closing drops the flock

    def __enter__(self) -> "DirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
