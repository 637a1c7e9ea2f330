"""Train one stage: `python train.py` or `anchormass-train` `[experiment=...] [model=...] [stage=...] [overrides]`.

Thin Hydra entry point; the work happens in anchormass.training.run.train. The task function
returns the run's last validation loss, which is what a sweeper minimises:
    python train.py -m hydra/sweeper=optuna_optim ...      (Optuna over lr / warmup / weight decay)
    python train.py [-m] hydra/launcher=slurm ...           (each run one Slurm job; see configs/hydra/)
"""

import sys

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from anchormass.cli import check_group_choices, check_overrides, exit_on_error, quoted_where_needed
from anchormass.errors import AnchorMassError
from anchormass.launch_checks import check_train_launch  # before Hydra writes the run folder: a refusal leaves nothing
from anchormass.logging_setup import apply_verbosity
from anchormass.training.run_dir import is_launching_process
from anchormass.utils import CONFIG_ROOT


@hydra.main(config_path=str(CONFIG_ROOT), config_name="train", version_base="1.3")
@exit_on_error
def main(cfg: DictConfig) -> float | None:
    from anchormass.training.callbacks import TrainingDiverged
    from anchormass.training.preemption import TrainingInterrupted, exit_interrupted
    from anchormass.training.run import train

    apply_verbosity(cfg)
    try:
        result = train(cfg)
    except TrainingDiverged as err:  # not bad input: its own exit code, same one-line style
        print(f"error: {err}", file=sys.stderr)
        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            # One diverged trial (a too-high learning rate) must not end the whole sweep:
            # NaN tells the sweeper this trial failed, and the next one runs.
            return float("nan")
        sys.exit(3)
    except TrainingInterrupted as stop:  # SIGTERM/SIGUSR1: saved at a step boundary (training/preemption.py)
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


def in_search() -> bool:
    """Whether this run is one trial of an Optuna search (hydra/sweeper=optuna_optim)."""
    if not (HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN):
        return False
    return "optuna" in str(HydraConfig.get().sweeper.get("_target_", "")).lower()


def through_launcher(argv: list[str]) -> list[str]:
    """`python train.py hydra/launcher=<name> ...` without -m: Hydra only uses a launcher for a
    multirun, so run it as a one-job multirun whose job folder is the folder the plain run would
    use. Scripts that call train.py (the curriculum's stages) then go to Slurm by adding
    `hydra/launcher=slurm` to their overrides, with nothing else changed."""
    if any(a in ("-m", "--multirun") for a in argv) or not any(a.startswith("hydra/launcher=") for a in argv):
        return argv
    return ["--multirun", *argv, "hydra.sweep.dir=${hydra.run.dir}", "hydra.sweep.subdir=."]


@exit_on_error
def claim_run_dir(argv: list[str]) -> None:
    """A single run claims its folder (training/run_dir.py) before Hydra writes its own records
    there (.hydra/, train.log): a refused second launch must leave the running one's files alone.
    Sweeps and launcher runs claim each job's folder inside the job; Hydra flags (--cfg, --help)
    run nothing and claim nothing."""
    from anchormass.training.run_dir import claim, is_launching_process
    from anchormass.training.slurm_requeue import requeue_resume

    if any(a.startswith("-") for a in argv) or not is_launching_process():
        return
    try:
        with initialize_config_dir(config_dir=str(CONFIG_ROOT), version_base="1.3"):
            cfg = compose("train", overrides=argv, return_hydra_config=True)
        run_dir, resume, overwrite = cfg.hydra.run.dir, cfg.get("ckpt_path"), cfg.get("overwrite")
        resume = resume or requeue_resume(run_dir)  # a requeued Slurm job continues its run (training/slurm_requeue.py)
    except Exception:  # bad overrides: Hydra reports them in its own words when it runs below
        return
    claim(run_dir, resume=bool(resume), overwrite=bool(overwrite))


@exit_on_error
def check_launcher_rerun(argv: list[str]) -> None:
    """A launcher run (through_launcher) claims its folder inside the job, where a refusal (a
    fresh run into a folder that holds checkpoints, a folder another run holds) reaches the
    console only under submitit's 30-line UncompletedJobError: make the same claim here, before
    anything is submitted, and let go of it for the job."""
    from anchormass.training.run_dir import claim, is_launching_process, release

    if not is_launching_process():
        return
    with initialize_config_dir(config_dir=str(CONFIG_ROOT), version_base="1.3"):
        cfg = compose("train", overrides=argv, return_hydra_config=True)  # check_overrides composed it already
    claim(cfg.hydra.run.dir, resume=bool(cfg.get("ckpt_path")), overwrite=bool(cfg.get("overwrite")))
    release(cfg.hydra.run.dir)


@exit_on_error
def check_run_dir(argv: list[str]) -> None:
    """Hydra creates its run (or sweep) folder before any of our code runs; an unwritable one must
    still fail with one line and exit 2, so check an explicit hydra.run.dir / hydra.sweep.dir first."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from anchormass.training.run import check_output_dir

    for arg in argv:
        if arg.startswith(("hydra.run.dir=", "hydra.sweep.dir=")):
            try:
                path = str(OverridesParser.create().parse_override(arg).value())  # "quoted" as written
            except Exception:  # not readable: Hydra reports it in its own words below
                return
            check_output_dir(path)


def cli() -> None:
    """`python train.py ...` and `anchormass-train ...`: checks before Hydra writes anything, then the run."""
    from anchormass.cli_help import exit_with_help
    from anchormass.training.logged_process import follow_parent

    exit_with_help(sys.argv[1:], "train.py", __doc__, ["experiment", "model", "stage", "data", "trainer", "logger",
                                                       "callbacks"], "train",
                   {"hydra/sweeper": ["basic", "optuna_optim"],
                    "hydra/launcher": ["basic", "slurm", "submitit_local", "submitit_slurm"]})

    follow_parent()  # a curriculum's stage ends with its runner
    sys.argv[1:] = quoted_where_needed(sys.argv[1:])  # a non-ASCII path is a path
    check_group_choices(CONFIG_ROOT, sys.argv[1:])
    launched = through_launcher(sys.argv[1:])
    check_overrides(CONFIG_ROOT, "train", launched, check=check_train_launch)
    check_run_dir(sys.argv[1:])
    if launched != sys.argv[1:]:
        check_launcher_rerun(sys.argv[1:])
    sys.argv[1:] = launched
    claim_run_dir(sys.argv[1:])
    main()


if __name__ == "__main__":
    cli()
