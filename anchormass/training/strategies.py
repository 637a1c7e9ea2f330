"""Strategy factories for configs that need Python objects YAML cannot express."""

from __future__ import annotations

import importlib

from lightning.pytorch.strategies import FSDPStrategy

from anchormass.errors import ConfigError

# Why trainer=fsdp needs a GPU with the pinned torch 2.13 / Lightning 2.6.6 (measured, docs/method.md §4):
# Lightning refuses FSDPStrategy on a non-CUDA accelerator (lightning/pytorch/trainer/connectors/
# accelerator_connector.py:431), and past that check it wraps the model with device_id=None on CPU
# (lightning/pytorch/strategies/fsdp.py:315), for which torch's FSDP raises "FSDP needs a non-CPU
# accelerator device" (torch/distributed/fsdp/_init_utils.py:389).
FSDP_ON_CPU = ("trainer=fsdp needs a GPU: Lightning 2.6.6 refuses FSDP on accelerator=cpu "
               "(accelerator_connector.py:431) and torch 2.13's FSDP has no CPU device (fsdp/_init_utils.py:389); "
               "on CPU use trainer=ddp_cpu")


def _import(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        raise ConfigError(f"fsdp wrap_modules: cannot import {dotted!r}") from None


def fsdp_strategy(wrap_modules: list[str], on_accelerator: str = "gpu", **kwargs) -> FSDPStrategy:
    """FSDPStrategy sharding each module of the named classes (e.g. one transformer block) as a
    unit; Lightning takes a set of classes as the auto-wrap policy. `on_accelerator` is the
    trainer's accelerator: on CPU the run is refused in one line instead of Lightning's traceback."""
    if str(on_accelerator).lower() == "cpu":
        raise ConfigError(FSDP_ON_CPU)
    return FSDPStrategy(auto_wrap_policy={_import(m) for m in wrap_modules}, **kwargs)
