"""Hydra finds sweepers only in the `hydra_plugins` namespace; this one is the Optuna plugin's
sweeper with the behaviour of anchormass/runs/optuna_search.py (a rerun continues the sweep,
one line when no trial completed). Kept import-light: Hydra imports every plugin module at start-up."""

from pathlib import Path

try:
    from hydra_plugins.hydra_optuna_sweeper.optuna_sweeper import OptunaSweeper
except ImportError:  # an install without the [sweep] extra: no sweeper, and no warning at each start-up
    OptunaSweeper = object  # anchormass/extras.py names the extra when hydra/sweeper=optuna_optim is asked for


class ResumableOptunaSweeper(OptunaSweeper):
    def setup(self, *, hydra_context, task_function, config) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        self.seed = config.hydra.sweeper.get("sampler", {}).get("seed")

    def sweep(self, arguments: list[str]) -> None:
        from anchormass.runs.optuna_search import sweep

        sweep(self.sweeper, self.sweep_dir, arguments, lambda: super(ResumableOptunaSweeper, self).sweep(arguments),
              self.seed)
