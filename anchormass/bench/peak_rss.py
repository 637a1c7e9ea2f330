"""Peak resident memory of this process and of its worker processes, from the kernel's per-process
high-water marks (Linux /proc).

`resource.getrusage(RUSAGE_CHILDREN).ru_maxrss` would be wrong for spawned workers: Linux carries a
process's high-water mark across fork + exec, so every child reports at least the parent's RSS at
the moment it was started. /proc/<pid>/status `VmHWM` belongs to the process's own memory map (a
new one at exec), so it is what each worker really held at its peak; it is read every `interval`
seconds while the workers live; the latest reading counts (it only grows after exec, so a late read
loses nothing but the last interval).
"""

from __future__ import annotations

import os
import resource
import threading
from pathlib import Path

_MIB = 1024 * 1024


def _hwm_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            kids = [int(k) for k in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        except (OSError, ValueError):
            continue
        for kid in kids:
            out += [kid, *_descendants(kid)]
    return out


class PeakRSS:
    """`with PeakRSS() as peak: ...`, then (MiB) peak.main_mib: this process's peak (whole life);
    peak.worker_mib: the largest peak of one descendant process; peak.total_mib: main + every
    descendant's peak, an upper bound on what the process tree held at once."""

    def __init__(self, interval: float = 0.05):
        self.interval = interval
        self._peaks: dict[int, int] = {}
        self.main_mib = self.worker_mib = self.total_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for pid in _descendants(os.getpid()):
            # the latest reading, not the largest: between fork and exec a child still shares the
            # parent's memory map (and reports its size); after exec its own mark only grows
            self._peaks[pid] = _hwm_bytes(pid) or self._peaks.get(pid, 0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self) -> "PeakRSS":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.main_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        self.worker_mib = max(self._peaks.values(), default=0) / _MIB
        self.total_mib = self.main_mib + sum(self._peaks.values()) / _MIB

    def as_dict(self) -> dict[str, float]:
        return {"main_mib": round(self.main_mib, 1), "largest_worker_mib": round(self.worker_mib, 1),
                "total_mib": round(self.total_mib, 1), "processes": 1 + len(self._peaks)}
