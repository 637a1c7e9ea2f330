"""Preemption: a scheduler's stop signal ends a run at an optimizer-step boundary, with a checkpoint.

A cluster stops a job with SIGTERM (and Slurm warns with SIGUSR1 before a time limit). Lightning's
own SIGTERM handling raises at the end of the current micro-batch, writes no checkpoint and exits 0,
so a preempted stage looked finished. Here the signal only sets a flag; at the next optimizer-step
boundary `PreemptCheckpoint` saves the same full checkpoint a periodic save writes (`last.ckpt`:
weights, optimizer, schedule, loop counters, data position, RNG), and raises `TrainingInterrupted`;
the entry points print one `interrupted: ...` line and exit `EXIT_INTERRUPTED`. Resuming that
checkpoint (`ckpt_path=last`) continues bitwise as if nothing happened (tests/test_preemption.py).
A signal during the stage's last step lets it finish as it would (final save, validation, a result
that says completed) and still ends the run with `EXIT_INTERRUPTED` (`stop_after_fit`), so a sweep
or a scheduler sees the stop (tests/test_kill_boundaries.py).

`preempt_signals` says which signals mean "stop and save"; under Slurm, SIGUSR1 then requeues the job
after the save (runs/slurm_requeue.py) rather than through a competing handler.
"""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator, NoReturn

import torch
from lightning.pytorch.callbacks import Callback

from anchormass.runs.logged_process import request_stop
from anchormass.runs.slurm_requeue import requeue
from anchormass.runs.stage_console import shown
from anchormass.training.callbacks import SaveLastOnEnd

# sysexits.h EX_TEMPFAIL: "temporary failure, try again". A run (or a curriculum) that exits with it
# stopped on a signal after saving; rerunning the same command resumes it.
EXIT_INTERRUPTED = 75


class TrainingInterrupted(Exception):
    """A run stopped on a preempt signal at a step boundary; the message is its one line to print
    (after `interrupted: `). Not an AnchorMassError: it is not bad input and has its own exit code."""


def exit_interrupted(stop: TrainingInterrupted, show: bool = True) -> NoReturn:
    """The entry points' end for an interrupted run: its one line on stderr, the resumable code."""
    if show:
        print(f"interrupted: {stop}", file=sys.stderr, flush=True)
    sys.exit(EXIT_INTERRUPTED)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def preempt_signals(trainer: Any = None) -> tuple[int, ...]:
    """The signals that mean "checkpoint at the next step boundary and exit resumable": SIGTERM and
    SIGUSR1. Under Slurm, SIGUSR1 (the time-limit warning) then also requeues the job, after the
    save, through the mechanism that owned it: submitit's handler or Lightning's SLURM auto-requeue
    (runs/slurm_requeue.py); Lightning's own handler would save mid-step, from the signal."""
    usr1 = getattr(signal, "SIGUSR1", None)
    return (signal.SIGTERM,) if usr1 is None else (signal.SIGTERM, usr1)


class PreemptCheckpoint(Callback):
    """On a preempt signal: finish the optimizer step in progress, save `last.ckpt` (and the
    periodic checkpoint if one is due at that step), raise `TrainingInterrupted`.

    The handler is installed at setup and installed again once Lightning's SignalConnector has
    replaced it (its SIGTERM handler would end the run mid-accumulation without a checkpoint);
    Lightning's forwarding of the signal to DDP worker processes is done here instead. All ranks
    agree on the stopping step (a max-reduce of the flag at each step boundary), because a save
    is collective.
    """

    def __init__(self) -> None:
        self.received: int | None = None  # the first preempt signal, until the run stops
        self.active = False  # between setup and the end of the fit
        self._previous: dict[int, Any] = {}  # the handlers found before ours, given back at the end
        self._trainer = None

    # -- the signal side: set a flag, never more (a handler may run between any two bytecodes)
    def request_stop(self, signum: int, frame=None) -> None:
        if not self.active:  # still installed after its run ended: act as the handler it replaced
            self._pass_on(signum, frame)
            return
        first = self.received is None
        self.received = signum if first else self.received
        launcher = getattr(getattr(self._trainer, "strategy", None), "launcher", None)
        if first and launcher is not None and hasattr(launcher, "kill"):
            launcher.kill(signum)  # DDP workers started by this process get the signal too

    def _pass_on(self, signum: int, frame) -> None:
        previous = self._previous.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:  # the default action (terminate), as if we were never here
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    def _install(self, trainer) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        self._trainer, self.active = trainer, True
        for sig in preempt_signals(trainer):
            current = signal.getsignal(sig)
            if current != self.request_stop:
                self._previous.setdefault(sig, current)
                signal.signal(sig, self.request_stop)
        connector = getattr(trainer, "_signal_connector", None)
        # Lightning gives back, when the fit ends, the handlers it found when it registered its own:
        # ours (installed at setup). Make those the ones we found, so every way out restores them.
        originals = getattr(connector, "_original_handlers", None)
        if isinstance(originals, dict):
            for sig, handler in self._previous.items():
                if originals.get(sig) == self.request_stop:
                    originals[sig] = handler
        # A SIGTERM caught by Lightning's handler in the moment before ours came back: ours now,
        # or Lightning would end the run at the next micro-batch without a checkpoint.
        if getattr(connector, "received_sigterm", False):
            connector.received_sigterm = False
            self.request_stop(signal.SIGTERM)

    def _restore(self) -> None:
        self.active = False
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, handler in self._previous.items():
            if signal.getsignal(sig) == self.request_stop and handler is not None:
                signal.signal(sig, handler)

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._install(trainer)

    # Lightning installs its handlers after on_fit_start, before the sanity check and the loop.
    def on_sanity_check_start(self, trainer, pl_module) -> None:
        self._install(trainer)

    def on_train_start(self, trainer, pl_module) -> None:
        self._install(trainer)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._restore()

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._restore()  # Lightning calls no teardown hook after an exception

    # -- the training side
    def _stop_requested(self, trainer) -> bool:
        if trainer.world_size == 1:
            return self.received is not None
        flag = torch.tensor(float(self.received is not None), device=trainer.strategy.root_device)
        return bool(trainer.strategy.reduce(flag, reduce_op="max").item() > 0)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # mid-accumulation: the optimizer step is not complete yet
        if trainer.global_step >= trainer.max_steps:
            return  # the last step: the run ends now anyway, complete, with its final save (stop_after_fit)
        if not self._stop_requested(trainer):
            return
        path = save_last(trainer, pl_module, outputs, batch, batch_idx)
        what = signal_name(self.received) if self.received is not None else "a preempt signal on another rank"
        saved = f"saved {shown(path)}; resume with ckpt_path=last" if path else "no checkpoint callback, nothing saved"
        requeued = requeue(trainer, self.received, self._previous.get(self.received))
        saved += f"; {requeued}" if requeued else ""
        raise TrainingInterrupted(f"{what} at step {trainer.global_step}; {saved}")


def stop_after_fit(trainer) -> TrainingInterrupted | None:
    """A preempt signal the fit did not act on: one that came during the stage's last step (or its
    final save and validation), which ended the stage complete. The run still exits resumable, so
    the process that sent it (a scheduler, a sweep, the curriculum) sees the stop instead of a run
    that went on; rerunning the same command finds the stage done."""
    received = next((cb.received for cb in trainer.callbacks
                     if isinstance(cb, PreemptCheckpoint) and cb.received is not None), None)
    if received is None:
        return None
    return TrainingInterrupted(f"{signal_name(received)} during the last step ({trainer.global_step}); the stage "
                               f"finished and saved; rerun the same command to go on after it")


def save_last(trainer, pl_module, outputs, batch, batch_idx) -> str | None:
    """Write what the checkpoint callbacks would write at this step, then `last.ckpt` if they did
    not already. They run after this callback (Lightning orders checkpoint callbacks last) and
    raising skips them, so a periodic checkpoint due now is made here through their own hook;
    `last.ckpt` the way SaveLastOnEnd writes it at a stage's end (one writer of that file)."""
    for cb in trainer.checkpoint_callbacks:
        cb.on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)  # a periodic save, if due
    SaveLastOnEnd().on_train_end(trainer, pl_module)  # no-op where last.ckpt is already at this step
    return next((cb.last_model_path for cb in trainer.checkpoint_callbacks if getattr(cb, "last_model_path", "")), None)


# What a process that runs training processes (the curriculum) stops on: a scheduler's signals and
# Ctrl-C. Its children get SIGTERM for SIGINT (a SIGINT is Lightning's KeyboardInterrupt: exit 1,
# no checkpoint) and the signal itself otherwise.
RUNNER_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGUSR1") if hasattr(signal, name))


@contextmanager
def forward_stop_signals() -> Iterator[None]:
    """While inside: a stop signal is passed on to every child started by run_logged, and
    logged_process.stop_requested() says so (the runner then starts nothing new, waits for its
    children to save and exit, and exits EXIT_INTERRUPTED). Handlers are restored on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum, frame) -> None:
        request_stop(signum, signal.SIGTERM if signum == signal.SIGINT else signum)

    previous = {sig: signal.signal(sig, forward) for sig in RUNNER_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
