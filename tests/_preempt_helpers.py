"""Test hooks for tests/test_preemption.py: a run that signals itself in the middle of a step."""

from __future__ import annotations

import os
import signal

from lightning.pytorch.callbacks import Callback


class SignalAt(Callback):
    """Send `signal_name` to this process once, after the first micro-batch seen at optimizer step
    `step` (with gradient accumulation: the middle of step `step + 1`).

    Refuses to send a signal that no Python handler catches: on code without preemption handling
    it would kill the process (the test runner itself, for in-process runs)."""

    def __init__(self, step: int, signal_name: str = "SIGTERM"):
        self.step, self.signum, self.sent = int(step), getattr(signal, signal_name), False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.sent or trainer.global_step != self.step:
            return
        if not callable(signal.getsignal(self.signum)):
            raise AssertionError(f"nothing handles {signal.Signals(self.signum).name}: it would kill the process")
        self.sent = True
        os.kill(os.getpid(), self.signum)
