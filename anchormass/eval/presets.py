"""Eval size presets (`configs/eval/<name>.yaml`) outside Hydra, e.g. for training callbacks.

Composed as Hydra composes the `eval` group (anchormass/config_compose.py): a preset's
`defaults: [<other>, _self_]` merges the other preset first, then the file's own keys on top.
"""

from __future__ import annotations

from omegaconf import OmegaConf

from anchormass.config_compose import compose_file
from anchormass.utils import CONFIG_ROOT

EVAL_CONFIG_DIR = CONFIG_ROOT / "eval"


def load_preset(name: str, overrides: dict | None = None) -> dict:
    merged = compose_file(name, EVAL_CONFIG_DIR, "eval preset")
    if overrides:
        merged = OmegaConf.merge(merged, OmegaConf.create(overrides))
    return OmegaConf.to_container(merged, resolve=True)
