"""Strategy factories for configs that need Python objects YAML cannot express."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from lightning.pytorch.strategies import FSDPStrategy

from anchormass.errors import ConfigError
from anchormass.training.safe_load import safe_torch_load

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


class SafeFSDPStrategy(FSDPStrategy):
    """FSDPStrategy whose restore opens a one-file checkpoint with the weights-only reader first:
    Lightning 2.6.6 reads a full (state_dict_type=full) checkpoint with its own unpickler
    (lightning/fabric/utilities/load.py _lazy_load), which ignores `weights_only`."""

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        if Path(checkpoint_path).is_file():
            safe_torch_load(checkpoint_path, mmap=True)  # UnsafeCheckpoint (one line) for a file holding code
        return super().load_checkpoint(checkpoint_path, weights_only=True)


def fsdp_strategy(wrap_modules: list[str], on_accelerator: str = "gpu", **kwargs) -> FSDPStrategy:
    """FSDPStrategy sharding each module of the named classes (e.g. one transformer block) as a
    unit; Lightning takes a set of classes as the auto-wrap policy. `on_accelerator` is the
    trainer's accelerator: on CPU the run is refused in one line instead of Lightning's traceback."""
    if str(on_accelerator).lower() == "cpu":
        raise ConfigError(FSDP_ON_CPU)
    return SafeFSDPStrategy(auto_wrap_policy={_import(m) for m in wrap_modules}, **kwargs)
