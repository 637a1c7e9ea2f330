"""Timing (warm-up, then repeats) and peak memory of one callable, on CPU or CUDA.

Peak memory:
- CUDA: `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`, minus the memory
  allocated when the measurement started (growth caused by the measured code).
- CPU: peak resident-set growth. The kernel's high-water mark (VmHWM) is reset through
  /proc/self/clear_refs before the run and read after it. Before that, glibc's dynamic mmap
  threshold is pinned (large tensors are mmapped and returned on free) and free heap pages are
  trimmed: memory that earlier work freed but kept resident would otherwise absorb the run's
  allocations and hide them. (tracemalloc cannot see torch's allocator, so it is not used.)
"""

from __future__ import annotations

import ctypes
import gc
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

CPU_MEMORY_METHOD = ("peak RSS growth (VmHWM reset via /proc/self/clear_refs after malloc_trim; "
                     "glibc mmap threshold 64 KiB)")
CUDA_MEMORY_METHOD = "torch.cuda.max_memory_allocated growth after reset_peak_memory_stats"

_M_MMAP_THRESHOLD = -3  # mallopt parameter ids from <malloc.h>
_M_TRIM_THRESHOLD = -1
_malloc_pinned = False


def sync(device: torch.device | str) -> None:
    """Wait for queued kernels so wall-clock times cover the work, not the launch."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device | str) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) for one call of `fn`, synchronised on both sides.

    CPU time is kept beside wall time because on a shared, oversubscribed machine wall time
    includes waiting for other processes; with one torch thread CPU time is close to the wall
    time the same work takes on an idle machine."""
    sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    sync(device)
    return time.perf_counter() - t0, time.process_time() - c0


@dataclass
class Timing:
    times: list[float] = field(default_factory=list)  # wall seconds, one per measured repeat
    cpu_times: list[float] = field(default_factory=list)  # process CPU seconds, same repeats

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_times)

    def add(self, wall_cpu: tuple[float, float]) -> None:
        self.times.append(wall_cpu[0])
        self.cpu_times.append(wall_cpu[1])

    def to_dict(self) -> dict:
        return {"median_s": self.median, "times_s": list(self.times),
                "cpu_median_s": self.cpu_median, "cpu_times_s": list(self.cpu_times)}


def time_interleaved(fns: dict[str, Callable[[], object]], device, warmup: int, repeats: int) -> dict[str, Timing]:
    """Time several callables in alternation (a, b, a, b, ...) so that load from other processes
    on a shared machine hits all of them alike; the ratio of medians is then a fair comparison."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out = {name: Timing() for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            out[name].add(time_call(fn, device))
    return out


# ---------------------------------------------------------------------------- memory
def _pin_glibc_mmap_threshold() -> None:
    global _malloc_pinned
    if _malloc_pinned:
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 64 * 1024)
        libc.mallopt(_M_TRIM_THRESHOLD, 128 * 1024)
    except OSError:  # not glibc: RSS growth is then a lower bound, still reported
        pass
    _malloc_pinned = True


def _release_free_heap() -> None:
    """Give freed heap pages back to the OS. Memory freed by earlier work stays resident in the
    heap; a session that reuses it would show no RSS growth at all."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _proc_status_kib(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise OSError(f"{key} not in /proc/self/status")


def memory_method(device: torch.device | str) -> str:
    return CUDA_MEMORY_METHOD if torch.device(device).type == "cuda" else CPU_MEMORY_METHOD


def peak_memory_growth(fn: Callable[[], object], device: torch.device | str) -> int:
    """Bytes: the peak memory while `fn` runs, minus the memory in use when it started."""
    device = torch.device(device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    _pin_glibc_mmap_threshold()
    _release_free_heap()
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")  # resets VmHWM to the current RSS
    base = _proc_status_kib("VmRSS")
    fn()
    # RSS counters are synced lazily per thread, so tiny sessions can read a few pages below base.
    return max(0, _proc_status_kib("VmHWM") - base) * 1024
