"""The Optuna sweeper (hydra_plugins/anchormass_sweeper/) as `train.py -m hydra/sweeper=optuna_optim` uses it.

Hydra's Optuna plugin, with what a research sweep needs on top:
- The study lives in the sweep folder (optuna_study.jsonl, runs/optuna_journal.py), so a rerun
  of the same command continues it: the sampler sees every earlier trial, they count towards
  `n_trials`, new trials get new folder numbers and, with the sampler reseeded by the number of
  earlier trials, new parameters. A note line says how to start over instead.
- A trial the stopped sweep left running resumes from its last checkpoint before new trials start;
  one that cannot is recorded as failed. Only a trial that trained all its steps has an objective
  (train.py returns None otherwise), so optimization_results.yaml ranks only finished trials.
- A sweep folder from before the journal is read from its trial folders (.hydra/overrides.yaml
  and train_result.json), each told to the study as completed (it trained all its steps) or failed,
  once its .hydra/config.yaml shows it ran with this sweep's fixed settings.
- A study's fixed settings (the composed config less the searched keys, runs/run_settings.py)
  are part of its identity: a rerun with other ones (`stage.total_steps=3` after 4) would rank
  3-step trials against 4-step ones, so it is refused in one line, as is a study whose settings
  were not recorded, and a damaged journal line (the file and line named).
- A sweep in which no trial completed ends with one line naming the folders to look at, not the
  plugin's `ValueError: No trials are completed yet`. (Failed trials are recorded as failed and the
  search goes on: `max_failure_rate: 1.0` in the config.)
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import yaml

from anchormass.errors import AnchorMassError, ConfigError
from anchormass.runs.layout import checkpoints_dir, result_file


def trial_folders(sweep_dir: Path) -> list[Path]:
    return sorted((p for p in sweep_dir.glob("*") if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))


def objective_of(folder: Path) -> float | None:
    """The trial's last validation loss (train.py's return value), or None if it has none or
    did not train all its steps (an interrupted trial's loss is a mid-run value)."""
    try:
        result = json.loads(result_file(folder).read_text())
        value = result["metrics"].get("val/loss") if result.get("completed") is True else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return float(value) if value is not None and math.isfinite(float(value)) else None


def params_of(folder: Path, distributions: dict) -> dict | None:
    """The searched values this trial ran with, typed as the search space has them (None when its
    overrides are missing or fall outside today's search space)."""
    try:
        overrides = dict(o.split("=", 1) for o in trial_overrides(folder) or [])
    except ValueError:
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


JOURNAL = "optuna_study.jsonl"


def legacy_trials(study: Any, impl: Any, arguments: list[str], folders: list[Path]) -> int:
    """Tell an empty study the trial folders a sweep from before the journal left (one trial per
    folder, in order, so trial numbers stay folder numbers); returns how many were completed."""
    import optuna
    from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides

    impl._process_searchspace_config()
    distributions, fixed = create_params_from_overrides([*impl._parse_sweeper_params_config(), *arguments])
    distributions = {k: v for k, v in distributions.items() if k not in fixed}
    completed = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # add_trial: stable since 2.0
        for folder in folders:
            params = params_of(folder, distributions)
            value = objective_of(folder)
            state = optuna.trial.TrialState.COMPLETE if value is not None and params else optuna.trial.TrialState.FAIL
            study.add_trial(optuna.trial.create_trial(
                params=params or {}, distributions=distributions if params else {}, state=state,
                value=value if state == optuna.trial.TrialState.COMPLETE else None,
                user_attrs={"folder": folder.name}))
            completed += state == optuna.trial.TrialState.COMPLETE
    return completed


def reseed(sampler: Any, seed: int) -> None:
    """Give `sampler` (and the samplers inside it, e.g. TPE's random start-up sampler) a new
    seed: a continued study must not draw its start-up points from the seed's beginning again,
    which repeats the earlier trials' parameters exactly."""
    import numpy as np
    import optuna

    for name, value in vars(sampler).items():
        if isinstance(value, np.random.RandomState):
            value.seed(seed)
        elif isinstance(value, optuna.samplers.BaseSampler):
            reseed(value, seed)


def resume_interrupted(impl: Any, study: Any, sweep_dir: Path) -> None:
    """Trials left running by a sweep that was stopped (Ctrl-C, SIGTERM, a kill): each continues
    from its folder's last checkpoint, with its own overrides, and is told its result; one that
    cannot (no checkpoint, or it fails) is recorded as failed, so it is never ranked."""
    import optuna

    from anchormass.runs.run_dir import checkpoints_in

    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        folder = sweep_dir / str(trial.user_attrs.get("folder", trial.number))
        overrides = trial_overrides(folder)
        value = None
        # any checkpoint, not only last.ckpt: a trial killed between its first step-N.ckpt and its
        # first last.ckpt resumes from step N (ckpt_path=last takes the highest recorded step)
        if overrides is not None and checkpoints_in(folder):
            print(f"note: trial {trial.number} was interrupted; resuming it from its newest checkpoint in "
                  f"{checkpoints_dir(folder)}", file=sys.stderr)
            overrides = [o for o in overrides if not o.startswith("ckpt_path=")] + ["ckpt_path=last"]
            ret = impl.launcher.launch([overrides], initial_job_idx=int(folder.name))[0]
            try:
                value = float(ret.return_value)
            except Exception:  # a failed resume: the trial fails, the search goes on
                value = None
        if value is None or not math.isfinite(value) or objective_of(folder) is None:
            print(f"note: trial {trial.number} ({folder}) did not finish; recorded as failed", file=sys.stderr)
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial.number, values=[value])


def name_trial_folders(impl: Any) -> None:
    """Record each new trial's folder in the study (as the trial's `folder` attribute), so that a
    later rerun finds the folder of a trial it has to resume."""
    configure = impl._configure_trials

    def configure_and_name(trials, *args):
        for i, trial in enumerate(trials):
            trial.set_user_attr("folder", str(impl.job_idx + i))
        return configure(trials, *args)

    impl._configure_trials = configure_and_name


def trial_overrides(folder: Path) -> list[str] | None:
    try:
        overrides = yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return overrides if isinstance(overrides, list) and all(isinstance(o, str) for o in overrides) else None


SETTINGS_ATTR = "fixed_settings"  # the study's user attribute holding them


def searched_keys(impl: Any, arguments: list[str]) -> list[str]:
    """The keys each trial sets itself: the search space's and any swept on the command line."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    plain = [a for a in arguments if not a.startswith("-")]
    return [str(k) for k in (impl.params or {})] + [
        o.key_or_group for o in OverridesParser.create().parse_overrides(plain) if o.is_sweep_override()]


def check_folder_settings(folders: list[Path], fixed: dict[str, Any], searched: list[str], sweep_dir: Path) -> None:
    """Trial folders of a sweep from before the journal, about to be told to a new study: each
    must have run with this sweep's fixed settings (its .hydra/config.yaml, as Hydra composed it)."""
    from omegaconf import OmegaConf

    from anchormass.runs.run_settings import run_settings, setting_differences

    for folder in folders:
        try:
            ran = run_settings(OmegaConf.load(folder / ".hydra" / "config.yaml"), leave_out=searched)
        except Exception:  # noqa: BLE001 - missing or not a config: what it ran with is not known
            ran = None
        diff = ["its .hydra/config.yaml is missing or unreadable"] if ran is None else setting_differences(ran, fixed)
        if diff:
            raise ConfigError(f"trial folder {folder} of the sweep in {sweep_dir} ran with other fixed settings "
                              f"({'; '.join(diff)}); ranking new trials with it would compare different runs: "
                              f"rerun with its settings, or start a new study in another hydra.sweep.dir")


def check_fixed_settings(study: Any, fixed: dict[str, Any], sweep_dir: Path) -> None:
    """Record the settings on a new study; refuse to continue one recorded with other settings (or
    none: what its trials ran with is not known)."""
    from anchormass.runs.run_settings import setting_differences

    recorded = study.user_attrs.get(SETTINGS_ATTR)
    if recorded is None and not study.trials:
        study.set_user_attr(SETTINGS_ATTR, fixed)
        return
    start_over = f"start a new study in another hydra.sweep.dir (or delete {sweep_dir})"
    trials = f"{len(study.trials)} trial{'s' if len(study.trials) != 1 else ''}"
    if not isinstance(recorded, dict):
        raise ConfigError(f"the study in {sweep_dir} does not record the settings its {trials} ran with, so "
                          f"new trials cannot be ranked with them; {start_over}")
    diff = setting_differences(recorded, json.loads(json.dumps(fixed)))  # compared as the file stores them
    if diff:
        raise ConfigError(f"the study in {sweep_dir} ran its {trials} with other fixed settings "
                          f"({'; '.join(diff)}); ranking new trials with them would compare different runs: "
                          f"rerun with the earlier settings, or {start_over}")


@contextlib.contextmanager
def quiet_optuna():
    import optuna

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


def sweep(impl: Any, sweep_dir: Path, arguments: list[str], run_sweep: Callable[[], None], seed: int | None) -> None:
    """`run_sweep()` (the plugin's sweep) for `impl` (its OptunaSweeperImpl), on the study kept in
    `sweep_dir`/optuna_study.jsonl: a rerun continues it (the sampler sees every earlier trial,
    interrupted trials resume first, new trials get new folders and new parameters), and a sweep
    in which no trial completed ends in one line."""
    import optuna

    from anchormass.runs.optuna_journal import JournalStorage
    from anchormass.runs.run_settings import run_settings

    folders = trial_folders(sweep_dir)
    try:
        if impl.storage is None:  # a user's own storage (a database URL) holds its own history
            impl.storage = JournalStorage(sweep_dir / JOURNAL)
        with quiet_optuna():  # the plugin announces the study itself
            study = optuna.create_study(study_name=impl.study_name, storage=impl.storage, sampler=impl.sampler,
                                        directions=impl._get_directions(), load_if_exists=True)
        searched = searched_keys(impl, arguments)
        fixed = run_settings(impl.config, leave_out=searched)
        if folders and not study.trials:
            check_folder_settings(folders, fixed, searched, sweep_dir)
        check_fixed_settings(study, fixed, sweep_dir)
    except AnchorMassError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if folders and not study.trials:
        legacy_trials(study, impl, arguments, folders)
    name_trial_folders(impl)
    earlier = len(study.trials)
    if earlier:
        impl.job_idx = max([impl.job_idx, earlier, *(int(f.name) + 1 for f in folders)])  # folders never reused
        impl.n_trials = max(0, impl.n_trials - earlier)
        if seed is not None:
            reseed(impl.sampler, int(seed) + earlier)
        completed = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
        print(f"note: continuing the sweep in {sweep_dir}: {earlier} earlier trials ({completed} completed), "
              f"{impl.n_trials} to go; to start over, delete {sweep_dir} or use another hydra.sweep.dir",
              file=sys.stderr)
        resume_interrupted(impl, study, sweep_dir)
    try:
        with quiet_optuna():  # the plugin loads the study made here: no "Using an existing study" line
            run_sweep()
    except ValueError as err:
        if "No trials are completed yet" not in str(err):
            raise
        print(f"error: no trial of the sweep in {sweep_dir} completed; each trial's log is "
              f"{sweep_dir}/<trial>/train.log", file=sys.stderr)
        sys.exit(1)
