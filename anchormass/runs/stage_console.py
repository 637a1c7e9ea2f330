"""What the curriculum shows while its stages run: one live line per running stage, one line per
finished stage, and a failed stage's log tail. Everything the stages print goes to their log files.

Worker threads report events into a queue; only the main thread writes to the terminal (tqdm's
bars are not thread-safe, and one writer keeps lines whole). On a terminal the live lines are tqdm
bars fed from each stage's progress file (anchormass/runs/progress.py); elsewhere (a pipe, a
CI log, a batch job's output file) they are printed as plain status lines every `heartbeat_s`.
"""

from __future__ import annotations

import os
import queue
import shutil
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

from anchormass.runs.progress import read_progress

TAIL_LINES = 20
BAR = "{{desc}}  {{bar:16}} {{n_fmt}}/{{total_fmt}}  {}"  # tqdm's fields, then our status text


def shown(path: str | os.PathLike) -> str:
    """A path as the user would type it from where they are: relative when under the cwd."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def terminal_size() -> tuple[int, int]:
    """(columns, rows), with 100 x 24 where the terminal reports 0 (tqdm would draw nothing)."""
    size = shutil.get_terminal_size((100, 24))
    return size.columns, size.lines


def tail(path: str | os.PathLike, n: int = TAIL_LINES) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return [line.rstrip("\n") for line in deque(fh, maxlen=n)]
    except FileNotFoundError:
        return []


def clock(seconds: float | None) -> str:
    if seconds is None:
        return "-:--"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def rate(tokens_per_s: float | None) -> str:
    if tokens_per_s is None:
        return "- tok/s"
    return f"{tokens_per_s / 1000:.1f}k tok/s" if tokens_per_s >= 1000 else f"{tokens_per_s:.0f} tok/s"


@dataclass
class Task:
    """One unit of work with its own log: a training stage, a data preparation, a report."""

    label: str  # "standard_tiny  pretrain_1k"
    log_path: Path
    progress_dir: Path | None = None  # where its progress.jsonl appears (training stages only)
    started: float = field(default_factory=time.perf_counter)


def status_text(task: Task) -> tuple[int, int | None, str]:
    """(step, total, 'loss x  y tok/s  ETA m:ss') from the task's newest progress record."""
    rec = read_progress(task.progress_dir) if task.progress_dir else None
    if not rec:
        return 0, None, f"starting ({clock(time.perf_counter() - task.started)})"
    loss = rec.get("loss")
    text = f"loss {loss:.4f}" if loss is not None else "loss -"
    return (int(rec["step"]), int(rec["total"]),
            f"{text}  {rate(rec.get('tokens_per_s'))}  ETA {clock(rec.get('eta_s'))}")


class StageConsole:
    """verbose 0: failures only; 1: live and finished lines; 2: finished lines, and the stages'
    own output streamed by the caller (so no live lines, which would interleave with it)."""

    def __init__(self, verbose: int = 1, stream: TextIO | None = None, live: bool | None = None,
                 heartbeat_s: float = 120.0, poll_s: float = 0.5):
        self.verbose = verbose
        self.stream = stream or sys.stdout
        is_tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.live = verbose == 1 and (is_tty if live is None else live)
        self.heartbeat_s = heartbeat_s if verbose == 1 else None
        self.poll_s = poll_s
        self.events: queue.Queue = queue.Queue()
        self._bars: dict[int, tqdm] = {}
        self._rows: dict[int, int] = {}  # bar -> terminal row below the cursor, reused when freed
        self._running: dict[int, Task] = {}
        self._last_beat = time.perf_counter()

    # Called from any thread.
    def post(self, kind: str, task: Task, **info) -> None:
        self.events.put((kind, task, info))

    # Main thread only.
    def print(self, text: str = "") -> None:
        if self._bars:
            tqdm.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def follow(self, futures) -> None:
        """Show events and live lines until every future is done and every event is shown."""
        while True:
            try:
                kind, task, info = self.events.get(timeout=self.poll_s)
                self._handle(kind, task, info)
                continue  # drain queued events before redrawing
            except queue.Empty:
                pass
            if all(f.done() for f in futures) and self.events.empty():
                break
            self._refresh()
        self._close_bars()

    def _handle(self, kind: str, task: Task, info: dict) -> None:
        key = id(task)
        if kind == "started":
            self._running[key] = task
            if self.live:
                row = min(set(range(len(self._rows) + 1)) - set(self._rows.values()))
                self._rows[key] = row
                cols, rows = terminal_size()
                self._bars[key] = tqdm(total=None, position=row, file=self.stream, leave=False, ncols=cols,
                                       nrows=rows, desc=task.label, bar_format=BAR.format(""))
            return
        if kind == "line":  # a stage's own output, streamed at verbose 2
            self.print(f"[{task.label}] {info['text']}")
            return
        self._running.pop(key, None)
        self._rows.pop(key, None)
        bar = self._bars.pop(key, None)
        if bar is not None:
            bar.close()
        if kind == "failed":
            self.failure(task, info["message"])
        elif kind == "interrupted":  # shown at every verbosity, like a failure, but nothing to debug
            self.print(f"{task.label}  {info['message']}")
        elif self.verbose >= 1:
            self.print(f"{task.label}  {info['message']}")

    def failure(self, task: Task, message: str) -> None:
        """Shown at every verbosity: the reason, the log's path and its last lines."""
        self.print(f"{task.label}  FAILED: {message}")
        self.print(f"  log: {shown(task.log_path)} (last {TAIL_LINES} lines below)")
        for line in tail(task.log_path):
            self.print(f"  | {line}")

    def _refresh(self) -> None:
        for key, task in self._running.items():
            step, total, text = status_text(task)
            bar = self._bars.get(key)
            if bar is not None:
                bar.total, bar.n = total, step
                bar.ncols, bar.nrows = terminal_size()
                bar.bar_format = BAR.format(text.replace("{", "{{").replace("}", "}}"))
                bar.refresh()
        now = time.perf_counter()
        if not self.live and self.heartbeat_s and self._running and now - self._last_beat >= self.heartbeat_s:
            self._last_beat = now
            for task in self._running.values():
                step, total, text = status_text(task)
                self.print(f"{task.label}  step {step}/{total or '?'}  {text}")

    def _close_bars(self) -> None:
        for bar in self._bars.values():
            bar.close()
        self._bars.clear()
        self._rows.clear()
