"""Eval size presets (`configs/eval/<name>.yaml`) outside Hydra, e.g. for training callbacks.

Mirrors Hydra's composition for these files: a preset's `defaults: [<other>, _self_]` merges the
other preset first, then the file's own keys on top.
"""

from __future__ import annotations


from omegaconf import OmegaConf

from anchormass.errors import ConfigError
from anchormass.utils import CONFIG_ROOT

EVAL_CONFIG_DIR = CONFIG_ROOT / "eval"


def load_preset(name: str, overrides: dict | None = None) -> dict:
    path = EVAL_CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in EVAL_CONFIG_DIR.glob("*.yaml"))
        raise ConfigError(f"unknown eval preset '{name}'; presets: {', '.join(names)}")
    own = OmegaConf.load(path)
    defaults = own.pop("defaults", []) if "defaults" in own else []
    merged = OmegaConf.create()
    for item in defaults:
        merged = OmegaConf.merge(merged, own if item == "_self_" else OmegaConf.create(load_preset(str(item))))
    if "_self_" not in defaults:
        merged = OmegaConf.merge(merged, own)
    if overrides:
        merged = OmegaConf.merge(merged, OmegaConf.create(overrides))
    return OmegaConf.to_container(merged, resolve=True)
