"""What a run computes, as comparable data: its composed config, flat (`stage.total_steps: 3`),
without the keys that only change what is shown or logged, where it is written, or how fast it
runs. A curriculum's finished stage (curriculum/changes.py) and a continued Optuna study
(optuna_search.py) are known to be the same run only when these agree: comparing the arguments
missed a changed preset file or a changed default in configs/train.yaml.

Values are left unresolved (`optim.lr: ${stage.lr}`): the keys they point to are compared
themselves, and a run folder or an environment variable needs no resolving to be compared.
"""

from __future__ import annotations

from typing import Any, Iterable

from omegaconf import DictConfig, OmegaConf

from anchormass.runs.run_record import flat

# Keys (and the keys under them) that change no result: Hydra's own node, the console, loggers and
# callbacks, the thread count (how fast, and the order of floating-point sums, as on another
# machine; data.num_workers writes byte-identical files), the run's name and folder, and how a launch
# treats an existing folder.
NOT_SETTINGS = ("hydra", "verbose", "logger", "callbacks", "trainer.enable_progress_bar", "torch_threads",
                "data.num_workers", "run_name", "output_dir", "ckpt_path", "overwrite", "resume_overrides")


# Settings added after runs were recorded, with the value every earlier run had in effect: a record
# without the key is the same run as a config with this value (the retrofit objectives, §6 l).
ADDED_LATER = {"stage.objective.kind": "lm", "stage.objective.teacher": None, "stage.trainable": "all",
               "model.outlier_scorer": "rule"}


def _left_out(key: str, prefixes: Iterable[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def run_settings(cfg: DictConfig, leave_out: Iterable[str] = ()) -> dict[str, Any]:
    """The composed config `cfg` flat, without NOT_SETTINGS and the keys in `leave_out` (an Optuna
    study's searched keys: each trial sets its own)."""
    skip = (*NOT_SETTINGS, *leave_out)
    tree = OmegaConf.to_container(cfg, resolve=False)
    return {k: v for k, v in sorted(flat(tree).items()) if not _left_out(k, skip)}


def setting_differences(old: dict[str, Any], new: dict[str, Any], limit: int = 6) -> list[str]:
    """`key: old -> new` for each key that differs (absent on one side: `-`), at most `limit`
    named and then how many more."""
    old, new = {**ADDED_LATER, **old}, {**ADDED_LATER, **new}
    keys = [k for k in sorted(set(old) | set(new)) if old.get(k, "-") != new.get(k, "-")]
    shown = [f"{k}: {old.get(k, '-')} -> {new.get(k, '-')}" for k in keys[:limit]]
    return shown + ([f"{len(keys) - limit} more"] if len(keys) > limit else [])
