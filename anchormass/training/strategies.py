"""Strategy factories for configs that need Python objects YAML cannot express."""

from __future__ import annotations

import importlib

from lightning.pytorch.strategies import FSDPStrategy

from anchormass.errors import ConfigError


def _import(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        raise ConfigError(f"fsdp wrap_modules: cannot import {dotted!r}") from None


def fsdp_strategy(wrap_modules: list[str], **kwargs) -> FSDPStrategy:
    """FSDPStrategy sharding each module of the named classes (e.g. one transformer block) as a
    unit; Lightning takes a set of classes as the auto-wrap policy."""
    return FSDPStrategy(auto_wrap_policy={_import(m) for m in wrap_modules}, **kwargs)
