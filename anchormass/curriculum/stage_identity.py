"""What a stage is: its fully composed train config (presets and defaults included, compared as
runs/run_settings.py flattens it) and the fingerprint of the prepared data folder it reads.

execute.py records both in the stage's stage_args.json before its first start; changes.py compares
them with what the recipe, the config files and the data folder give now. Comparing the train.py
arguments alone credited a stage to settings it was not trained with: a changed preset file
(configs/model/*.yaml), a changed default in configs/train.yaml, a data folder prepared again with
other settings all left the arguments as they were.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

from anchormass.data.dataset_dir import fingerprint
from anchormass.errors import AnchorMassError
from anchormass.runs.run_settings import run_settings
from anchormass.utils import CONFIG_ROOT, resolve_path

_COMPOSING = threading.Lock()  # Hydra's global instance: one composition at a time


def identify(runs: list) -> None:
    """Set `settings` and `data_dir` of each run (a StageRun) that has none, composing train.py's
    config from its arguments as train.py will (one Hydra context for all of them); where they do
    not compose, `unknown` says why (the stage, when it starts, refuses them in its own line).
    Thread-safe: a chain's thread identifies its stage just before starting it (a study of 116
    stages took 35 s to compose on a loaded 2-core machine, so only a rerun's finished stages are
    composed up front)."""
    from hydra import compose
    from omegaconf import OmegaConf

    todo = [r for r in runs if r.settings is None and r.unknown is None and r.shared_from is None]
    if not todo:
        return
    with _COMPOSING, configs_here():
        for run in todo:
            try:
                cfg = compose("train", overrides=list(run.args))
            except Exception as err:  # noqa: BLE001 - train.py refuses these arguments itself, in its words
                lines = str(err).strip().splitlines()
                run.unknown = f"its train config does not compose now ({lines[0] if lines else type(err).__name__})"
                continue
            run.settings = run_settings(cfg)
            try:
                run.data_dir = resolve_path(str(OmegaConf.select(cfg, "data_dir")))
            except Exception:  # an interpolation only the stage can resolve: its data is not known here
                run.data_dir = None


@contextlib.contextmanager
def configs_here():
    """Hydra's compose() over CONFIG_ROOT, also inside a Hydra app (scripts/run_curriculum.py is one):
    Hydra keeps one global instance, so the app's is set aside and put back after."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.singleton import Singleton

    outer = Singleton._instances.pop(GlobalHydra, None)
    try:
        with initialize_config_dir(config_dir=str(CONFIG_ROOT), version_base="1.3"):
            yield
    finally:
        if outer is not None:
            Singleton._instances[GlobalHydra] = outer


def data_fingerprint(data_dir: Path | None) -> str | None:
    """The prepared folder's fingerprint (data/dataset_dir.py), None when there is none to read."""
    if data_dir is None or not (Path(data_dir) / "meta.json").is_file():
        return None
    try:
        return fingerprint(data_dir)
    except (AnchorMassError, OSError, KeyError, ValueError):
        return None
