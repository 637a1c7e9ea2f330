"""Train one stage: `python train.py [experiment=...] [model=...] [stage=...] [overrides]`.

Thin Hydra entry point; the work happens in anchormass.training.run.train.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from anchormass.cli import check_group_choices, exit_on_error
from anchormass.logging_setup import apply_verbosity
from anchormass.training.callbacks import TrainingDiverged


@hydra.main(config_path="configs", config_name="train", version_base="1.3")
@exit_on_error
def main(cfg: DictConfig) -> None:
    from anchormass.training.run import train

    apply_verbosity(cfg)
    try:
        result = train(cfg)
    except TrainingDiverged as err:  # not bad input: its own exit code, same one-line style
        print(f"error: {err}", file=sys.stderr)
        sys.exit(3)
    print(f"done: step {result['global_step']}, last checkpoint {result['last_checkpoint']}")


@exit_on_error
def check_run_dir(argv: list[str]) -> None:
    """Hydra creates its run folder before any of our code runs; an unwritable one must still
    fail with one line and exit 2, so check an explicit hydra.run.dir first."""
    from anchormass.training.run import check_output_dir

    for arg in argv:
        if arg.startswith("hydra.run.dir="):
            check_output_dir(arg.split("=", 1)[1])


if __name__ == "__main__":
    check_group_choices(Path(__file__).parent / "configs", sys.argv[1:])
    check_run_dir(sys.argv[1:])
    main()
