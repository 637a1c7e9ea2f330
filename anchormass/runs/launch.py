"""One training launch (`python train.py` / `anchormass-train`), around Hydra's run of `train`.

`before_hydra(argv)` runs first: it composes the config ONCE (cli.check_overrides: one line and
exit 2 for an unknown key or choice), checks it (launch_checks.py), and claims the run folder, all
before Hydra creates that folder, so a refused launch leaves nothing behind; it returns the
arguments Hydra gets. `run_stage(cfg)` is then Hydra's task function: train, and turn how the
run ended into the console line, exit code and sweeper objective.
"""

from __future__ import annotations

import sys

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from anchormass.cli import check_group_choices, check_overrides, exit_on_error, quoted_where_needed
from anchormass.errors import AnchorMassError
from anchormass.logging_setup import apply_verbosity
from anchormass.runs.launch_checks import check_train_launch
from anchormass.runs.run_dir import claim, is_launching_process, release
from anchormass.utils import CONFIG_ROOT


def before_hydra(argv: list[str]) -> list[str]:
    """Everything a launch checks and claims before Hydra writes anything; the arguments for Hydra."""
    from anchormass.runs.logged_process import follow_parent

    follow_parent()  # a curriculum's stage ends with its runner
    argv = quoted_where_needed(argv)  # a non-ASCII path is a path
    check_group_choices(CONFIG_ROOT, argv)
    launched = through_launcher(argv)
    composed = check_overrides(CONFIG_ROOT, "train", launched, check=check_train_launch)
    check_run_dir(argv)
    if launched != argv:
        check_launcher_rerun(composed[0])
    elif not any(a.startswith("-") for a in argv):
        claim_run_dir(composed[0])
    return launched


def through_launcher(argv: list[str]) -> list[str]:
    """`python train.py hydra/launcher=<name> ...` without -m: Hydra only uses a launcher for a
    multirun, so run it as a one-job multirun whose job folder is the folder the plain run would
    use. Scripts that call train.py (the curriculum's stages) then go to Slurm by adding
    `hydra/launcher=slurm` to their overrides, with nothing else changed."""
    if any(a in ("-m", "--multirun") for a in argv) or not any(a.startswith("hydra/launcher=") for a in argv):
        return argv
    return ["--multirun", *argv, "hydra.sweep.dir=${hydra.run.dir}", "hydra.sweep.subdir=."]


@exit_on_error
def check_run_dir(argv: list[str]) -> None:
    """Hydra creates its run (or sweep) folder before any of our code runs; an unwritable one must
    still fail with one line and exit 2, so check an explicit hydra.run.dir / hydra.sweep.dir first."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from anchormass.runs.train import check_output_dir

    for arg in argv:
        if arg.startswith(("hydra.run.dir=", "hydra.sweep.dir=")):
            try:
                path = str(OverridesParser.create().parse_override(arg).value())  # "quoted" as written
            except Exception:  # not readable: Hydra reports it in its own words below
                return
            check_output_dir(path)


@exit_on_error
def claim_run_dir(cfg: DictConfig) -> None:
    """A single run claims its folder (run_dir.py) before Hydra writes its own records there
    (.hydra/, train.log): a refused second launch must leave the running one's files alone.
    Sweeps and launcher runs claim each job's folder inside the job."""
    from anchormass.runs.slurm_requeue import requeue_resume

    if not is_launching_process():
        return
    run_dir = cfg.hydra.run.dir
    resume = cfg.get("ckpt_path") or requeue_resume(run_dir)  # a requeued Slurm job continues its run
    claim(run_dir, resume=bool(resume), overwrite=bool(cfg.get("overwrite")))


@exit_on_error
def check_launcher_rerun(cfg: DictConfig) -> None:
    """A launcher run (through_launcher) claims its folder inside the job, where a refusal (a
    fresh run into a folder that holds checkpoints, a folder another run holds) reaches the
    console only under submitit's 30-line UncompletedJobError: make the same claim here, before
    anything is submitted, and let go of it for the job."""
    if not is_launching_process():
        return
    claim(cfg.hydra.run.dir, resume=bool(cfg.get("ckpt_path")), overwrite=bool(cfg.get("overwrite")))
    release(cfg.hydra.run.dir)


@exit_on_error
def run_stage(cfg: DictConfig) -> float | None:
    """Hydra's task function: train one stage. Returns the sweeper's objective, the run's last
    validation loss (None for a run that did not train all its steps, or a refused search trial)."""
    from anchormass.runs.preemption import TrainingInterrupted, exit_interrupted
    from anchormass.runs.train import train
    from anchormass.training.callbacks import TrainingDiverged

    apply_verbosity(cfg)
    try:
        result = train(cfg)
    except TrainingDiverged as err:  # not bad input: its own exit code, same one-line style
        print(f"error: {err}", file=sys.stderr)
        if in_multirun():
            # One diverged trial (a too-high learning rate) must not end the whole sweep:
            # NaN tells the sweeper this trial failed, and the next one runs.
            return float("nan")
        sys.exit(3)
    except TrainingInterrupted as stop:  # SIGTERM/SIGUSR1: saved at a step boundary (preemption.py)
        exit_interrupted(stop, show=is_launching_process())  # one line, not one per DDP rank
    except AnchorMassError as err:
        if not in_search():
            raise
        # A trial refused for its sampled values (warmup past the stage's end) fails alone: no
        # objective, recorded as failed, and the search goes on.
        print(f"error: {err}", file=sys.stderr)
        return None
    print(f"done: step {result['global_step']}, last checkpoint {result['last_checkpoint']}")
    # The sweeper's objective: only a run that trained all its steps has one (an Optuna sweep ranks it).
    return result["metrics"].get("val/loss") if result.get("completed") else None


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def in_search() -> bool:
    """Whether this run is one trial of an Optuna search (hydra/sweeper=optuna_optim)."""
    return in_multirun() and "optuna" in str(HydraConfig.get().sweeper.get("_target_", "")).lower()
