"""Train one stage: `python train.py` or `anchormass-train` `[experiment=...] [model=...] [stage=...] [overrides]`.

Thin Hydra entry point; the launch (checks, the run folder's claim, how a run ends) is
anchormass/runs/launch.py and the work anchormass.runs.train.train. The task function
returns the run's last validation loss, which is what a sweeper minimises:
    python train.py -m hydra/sweeper=optuna_optim ...      (Optuna over lr / warmup / weight decay)
    python train.py [-m] hydra/launcher=slurm ...           (each run one Slurm job; see configs/hydra/)
"""

import sys

import hydra
from omegaconf import DictConfig

from anchormass.utils import CONFIG_ROOT


@hydra.main(config_path=str(CONFIG_ROOT), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    from anchormass.runs.launch import run_stage

    return run_stage(cfg)


def cli() -> None:
    """`python train.py ...` and `anchormass-train ...`: checks before Hydra writes anything, then the run."""
    from anchormass.cli_help import exit_with_help

    exit_with_help(sys.argv[1:], "train.py", __doc__, ["experiment", "model", "stage", "data", "trainer", "logger",
                                                       "callbacks"], "train",
                   {"hydra/sweeper": ["basic", "optuna_optim"],
                    "hydra/launcher": ["basic", "slurm", "submitit_local", "submitit_slurm"]})
    from anchormass.runs.launch import before_hydra  # after --help: it is answered before torch loads

    sys.argv[1:] = before_hydra(sys.argv[1:])
    main()


if __name__ == "__main__":
    cli()
