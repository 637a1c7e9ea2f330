"""A training run's progress as JSON lines, for a parent process that shows it (the curriculum).

The writer is a Lightning callback appending one record per reported optimizer step to
`<run folder>/progress.jsonl`: {"step", "total", "loss", "tokens_per_s", "eta_s"}. The reader
takes the newest complete record. Appending is safe without atomic writes here because the
reader ignores a last line that is not yet complete, and the file is a live status, never an
input to training.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from pathlib import Path

from lightning.pytorch.callbacks import Callback

PROGRESS_FILE = "progress.jsonl"


class ProgressFile(Callback):
    """Writes the progress record at most every `min_interval_s` seconds, and always at the
    first and the last step, so a parent polling the file twice a second sees every change
    that matters without the file growing by one line per step on a long run."""

    def __init__(self, min_interval_s: float = 0.5, window: int = 20):
        self.min_interval_s = float(min_interval_s)
        self._steps: deque[tuple[float, int, int]] = deque(maxlen=window + 1)  # (time, step, tokens so far)
        self._tokens = 0
        self._last_write = -math.inf
        self._path: Path | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        if not trainer.is_global_zero:
            return
        self._path = Path(trainer.default_root_dir) / PROGRESS_FILE
        self._steps.clear()
        self._tokens = 0
        self._steps.append((time.perf_counter(), trainer.global_step, 0))
        self._write(trainer, loss=None)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._path is None:
            return
        self._tokens += batch["input_ids"].numel() * trainer.world_size
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # the optimizer step is not complete yet
        self._steps.append((time.perf_counter(), trainer.global_step, self._tokens))
        now = time.perf_counter()
        if now - self._last_write >= self.min_interval_s or trainer.global_step >= trainer.max_steps:
            loss = trainer.callback_metrics.get("train/loss")
            self._write(trainer, loss=None if loss is None else float(loss))

    def _write(self, trainer, loss: float | None) -> None:
        (t0, step0, tok0), (t1, step1, tok1) = self._steps[0], self._steps[-1]
        elapsed = t1 - t0
        # Rates over the recent window: a validation pause early in the stage does not skew them for long.
        steps_per_s = (step1 - step0) / elapsed if elapsed > 0 else 0.0
        total = int(trainer.max_steps)
        record = {"step": int(trainer.global_step), "total": total, "loss": loss,
                  "tokens_per_s": (tok1 - tok0) / elapsed if elapsed > 0 else None,
                  "eta_s": (total - trainer.global_step) / steps_per_s if steps_per_s > 0 else None}
        with open(self._path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        self._last_write = time.perf_counter()


def read_progress(run_dir: str | Path) -> dict | None:
    """The newest complete progress record of a run, or None before its first one."""
    path = Path(run_dir) / PROGRESS_FILE
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 4096))
            tail = fh.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None
    for line in reversed(tail.split("\n")[:-1]):  # the text after the last newline may be half-written
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None
