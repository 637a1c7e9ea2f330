"""Slurm: a job warned of its time limit requeues itself after its step-boundary checkpoint, and the
job Slurm runs again resumes from it.

- Slurm warns a job before its time limit with SIGUSR1 (`sbatch --signal=USR1@120`). PreemptCheckpoint
  (runs/preemption.py) takes the signal, finishes the optimizer step and saves; then `requeue`
  hands the job back to Slurm through the mechanism that owned SIGUSR1: the handler installed before
  ours (submitit's, under hydra/launcher=slurm: it re-submits the same job and exits) or, when nobody
  had one, Lightning's SLURM auto-requeue (SLURMEnvironment(auto_requeue=True), its default under
  Slurm: it writes hpc_ckpt_<n>.ckpt in the run folder and runs `scontrol requeue $SLURM_JOB_ID`).
  Deferred to the step boundary, Lightning's save holds the same state as last.ckpt, so it is
  removed again (one resume point); called from a signal handler mid-step, as Lightning does by
  itself, it could catch the optimizer half-way.
- SIGTERM (preemption, scancel, the limit itself) saves and exits without a requeue: Slurm requeues
  a preempted job itself where the partition says so (PreemptMode=REQUEUE), and a cancelled job must
  stay cancelled.
- A job Slurm runs again (SLURM_RESTART_COUNT >= 1) runs the same command: with no ckpt_path and a
  checkpoint in its run folder it resumes as `ckpt_path=last` (the highest-step checkpoint), instead
  of being refused as a fresh run into another run's folder. That run is the same stage, unfinished:
  it says `completed: false` until its last step (runs/train.py), so a curriculum never counts it
  done early.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.environments import SLURMEnvironment

from anchormass.runs.layout import checkpoints_dir

REQUEUE_SIGNAL = getattr(signal, "SIGUSR1", None)
HPC_GLOB = "hpc_ckpt_*.ckpt"  # what Lightning's requeue handler writes into the run folder


def requeued_job() -> bool:
    """This process is a Slurm job that Slurm started again after a requeue."""
    try:
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    except ValueError:
        return False
    return restarts > 0 and SLURMEnvironment.detect()


def requeue_resume(folder: str | os.PathLike) -> str | None:
    """`last` for a requeued Slurm job whose run folder holds a checkpoint, else None."""
    has_checkpoint = any(checkpoints_dir(folder).glob("*.ckpt"))
    return "last" if has_checkpoint and requeued_job() else None


def lightning_auto_requeue(trainer: Any) -> bool:
    env = getattr(getattr(trainer, "_accelerator_connector", None), "cluster_environment", None)
    return isinstance(env, SLURMEnvironment) and env.auto_requeue and env.requeue_signal == REQUEUE_SIGNAL


def _all_ranks_agree(trainer: Any, wanted: bool) -> bool:
    """Lightning's requeue saves a checkpoint, a collective: every rank decides the same."""
    if trainer.world_size == 1:
        return wanted
    flag = torch.tensor(float(wanted), device=trainer.strategy.root_device)
    return bool(trainer.strategy.reduce(flag, reduce_op="max").item() > 0)


def requeue(trainer: Any, signum: int | None, previous: Any) -> str | None:
    """After the step-boundary save: requeue the job if `signum` is Slurm's time-limit warning.
    `previous` is the handler SIGUSR1 had before PreemptCheckpoint took it. Returns what was done
    (for the one `interrupted:` line), or None."""
    wanted = REQUEUE_SIGNAL is not None and signum == REQUEUE_SIGNAL and SLURMEnvironment.detect()
    if not _all_ranks_agree(trainer, wanted):
        return None
    job = os.environ.get("SLURM_JOB_ID", "?")
    if callable(previous):  # submitit's handler: dumps the re-submission, requeues, exits
        print(f"note: SIGUSR1 handed to {getattr(previous, '__qualname__', previous)} to requeue Slurm job {job}",
              file=sys.stderr)
        previous(REQUEUE_SIGNAL, None)
        return f"requeued Slurm job {job}"
    if lightning_auto_requeue(trainer):
        folder = Path(trainer.default_root_dir)
        before = set(folder.glob(HPC_GLOB))
        # Lightning's own SLURM auto-requeue handler (lightning/pytorch/trainer/connectors/
        # signal_connector.py: hpc checkpoint + `scontrol requeue`), called here at the step
        # boundary rather than from the signal itself. Private in Lightning 2.6.6; tests/test_slurm_requeue.py
        # runs it, so a Lightning that renames it fails there.
        trainer._signal_connector._slurm_sigusr_handler_fn(REQUEUE_SIGNAL, None)
        if trainer.is_global_zero:
            # Its hpc_ckpt_<n>.ckpt holds this step, as last.ckpt does: one resume point, not two (and
            # no file a later fresh run under Slurm would be resumed from by Lightning unasked).
            for path in set(folder.glob(HPC_GLOB)) - before:
                path.unlink(missing_ok=True)
        return f"requeued Slurm job {job} (scontrol requeue)"
    return None
