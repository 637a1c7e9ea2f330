"""A config file composed as Hydra composes a group's file, for code that reads one outside Hydra.

`train.py`, `evaluate.py` and `scripts/run_curriculum.py` compose their configs with Hydra. Three
readers work outside it: a model preset loaded by name (a checkpoint, a benchmark, a probe), an
eval preset read by a training-time callback, and the data configs a curriculum prepares. They all
read a file of one config group through this one function, so the files mean the same thing
wherever they are read: a file's `defaults: [<name>, ..., _self_]` merges each named file first
(beside the file, else in the group's folder), then the file's own keys where `_self_` stands
(last when it is absent); later keys win, nested mappings merge.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from anchormass.errors import ConfigError


def group_names(group_dir: Path) -> list[str]:
    """The file names (without .yaml) a group offers, sorted: what an error lists as choices."""
    return sorted(p.stem for p in Path(group_dir).glob("*.yaml"))


def group_file(spec: str | Path, group_dir: Path, what: str) -> Path:
    """`spec` as a path (it ends in .yaml/.yml) or a name in `group_dir`; a one-line error naming
    the choices when there is no such file."""
    path = Path(spec)
    if path.suffix not in (".yaml", ".yml"):
        path = Path(group_dir) / f"{spec}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown {what} '{spec}': no {path}; presets: {', '.join(group_names(group_dir))}")
    return path


def compose_file(spec: str | Path, group_dir: Path, what: str, _seen: tuple[Path, ...] = ()) -> DictConfig:
    """The file's keys with its defaults list applied (see the module docstring)."""
    path = group_file(spec, group_dir, what)
    if path in _seen:
        raise ConfigError(f"{what} config {path}: its defaults list includes itself")
    own = OmegaConf.load(path)
    if not isinstance(own, DictConfig):
        raise ConfigError(f"{what} config {path} must be a mapping")
    defaults = list(own.pop("defaults", None) or [])
    if "_self_" not in defaults:
        defaults.append("_self_")
    merged = OmegaConf.create()
    for entry in defaults:
        if entry == "_self_":
            merged = OmegaConf.merge(merged, own)
        elif isinstance(entry, str):
            local = path.parent / f"{entry}.yaml"  # beside the file, else a file of the group
            merged = OmegaConf.merge(merged, compose_file(local if local.is_file() else entry, group_dir, what,
                                                          (*_seen, path)))
        else:
            raise ConfigError(f"{what} config {path}: defaults entries must be names of {what} files, got {entry!r}")
    return merged
