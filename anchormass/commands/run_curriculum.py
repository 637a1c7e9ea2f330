"""Run a whole training curriculum for its models, then the closing comparison report (or `anchormass-curriculum`).

    python scripts/run_curriculum.py                      # the miniature (configs/curriculum/mini.yaml)
    python scripts/run_curriculum.py curriculum=full_158m trainer=ddp trainer.devices=8

Options (configs/run_curriculum.yaml): curriculum=<name>, runs_root=<dir>, evaluate=false,
verbose=0|1|2, curriculum.models=[a,b], curriculum.only=[a] (some of the recipe's own named models),
curriculum.parallel=<n>, curriculum.seeds=[0,1,2]. Every other override is a train.py override and
goes to each stage. Rerunning the same command resumes.
Ctrl-C / SIGTERM / SIGUSR1: the running stages save at their next optimizer step, nothing else
starts, exit 75 (resumable). A second runner of the same curriculum is refused (exit 2).
With seeds, each comparison runs once per seed and is then aggregated over the seeds.
The work is anchormass/curriculum/ (recipe, plan, execution, closing report).
"""

from __future__ import annotations

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from anchormass.cli import exit_on_error
from anchormass.commands.arguments import check_arguments
from anchormass.utils import CONFIG_ROOT


@hydra.main(version_base="1.3", config_path=str(CONFIG_ROOT), config_name="run_curriculum")
@exit_on_error
def main(cfg: DictConfig) -> None:
    from anchormass.curriculum.runner import run_curriculum

    overrides = HydraConfig.get().overrides
    run_curriculum(cfg, list(overrides.task), list(overrides.hydra))


def cli() -> None:
    """`python scripts/run_curriculum.py ...` and `anchormass-curriculum ...`."""
    check_arguments("scripts/run_curriculum.py", __doc__, "run_curriculum", ["curriculum", "trainer", "logger"])
    main()


if __name__ == "__main__":
    cli()
