"""The Optuna sweeper (hydra_plugins/anchormass_sweeper/) as `train.py -m hydra/sweeper=optuna_optim` uses it.

Hydra's Optuna plugin, with what a research sweep needs on top:
- A rerun of the same command continues the sweep: each earlier trial folder (its
  .hydra/overrides.yaml and train_result.json) is told to the new study as a completed or failed
  trial, so the sampler learns from it, it counts towards `n_trials`, and new trials get new folder
  numbers (no folder is reused). A note line says how to start over instead. This needs no
  database: Optuna's RDB storage does not run with the pinned optuna 2.10 and SQLAlchemy 2.
- A sweep in which no trial completed ends with one line naming the folders to look at, not the
  plugin's `ValueError: No trials are completed yet`. (Failed trials are recorded as failed and the
  search goes on: `max_failure_rate: 1.0` in the config.)
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import yaml


def trial_folders(sweep_dir: Path) -> list[Path]:
    return sorted((p for p in sweep_dir.glob("*") if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def objective_of(folder: Path) -> float | None:
    """The trial's last validation loss (train.py's return value), or None if it has none."""
    try:
        value = json.loads((folder / "train_result.json").read_text())["metrics"].get("val/loss")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return float(value) if value is not None and math.isfinite(float(value)) else None


def params_of(folder: Path, distributions: dict) -> dict | None:
    """The searched values this trial ran with, typed as the search space has them (None when its
    overrides are missing or fall outside today's search space)."""
    try:
        overrides = dict(o.split("=", 1) for o in yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()))
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    params = {}
    for name, dist in distributions.items():
        if name not in overrides:
            return None
        raw = overrides[name]
        if hasattr(dist, "choices"):
            value = next((c for c in dist.choices if str(c) == raw), None)
        else:
            value = int(float(raw)) if type(dist).__name__.startswith("Int") else float(raw)
        if value is None or not dist._contains(dist.to_internal_repr(value)):
            return None
        params[name] = value
    return params


def earlier_study(impl: Any, arguments: list[str], folders: list[Path]):
    """An in-memory study holding `folders` as finished trials; (storage, trials told)."""
    import optuna
    from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides

    impl._process_searchspace_config()
    distributions, fixed = create_params_from_overrides([*impl._parse_sweeper_params_config(), *arguments])
    distributions = {k: v for k, v in distributions.items() if k not in fixed}
    storage = optuna.storages.InMemoryStorage()
    told = 0
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the plugin announces the study itself
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # add_trial: stable since 2.0
            study = optuna.create_study(study_name=impl.study_name, storage=storage,
                                        directions=impl._get_directions())
            for folder in folders:
                params = params_of(folder, distributions)
                if params is None:
                    continue
                value = objective_of(folder)
                state = optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL
                study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions, state=state,
                                                          value=value))
                told += 1
    finally:
        optuna.logging.set_verbosity(verbosity)
    return storage, told


def sweep(impl: Any, sweep_dir: Path, arguments: list[str], run_sweep: Callable[[], None]) -> None:
    """`run_sweep()` (the plugin's sweep) for `impl` (its OptunaSweeperImpl), continuing the trials
    already in `sweep_dir` and ending in one line when no trial completed."""
    folders = trial_folders(sweep_dir)
    if folders:
        impl.job_idx = max(impl.job_idx, int(folders[-1].name) + 1)  # trial folders are never reused
        impl.n_trials = max(0, impl.n_trials - len(folders))
        told = 0
        if impl.storage is None:  # a user's own storage holds its own history
            impl.storage, told = earlier_study(impl, arguments, folders)
        print(f"note: continuing the sweep in {sweep_dir}: {len(folders)} earlier trials ({told} told to Optuna), "
              f"{impl.n_trials} to go; to start over, delete {sweep_dir} or use another hydra.sweep.dir",
              file=sys.stderr)
    try:
        run_sweep()
    except ValueError as err:
        if "No trials are completed yet" not in str(err):
            raise
        print(f"error: no trial of the sweep in {sweep_dir} completed; each trial's log is "
              f"{sweep_dir}/<trial>/train.log", file=sys.stderr)
        sys.exit(1)
