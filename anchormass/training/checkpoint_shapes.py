"""A checkpoint's hyper-parameters against the weights it holds, before a model is built from them.

`model_config` says how big a model to build (`vocab_size=2**40` asks for a 2**40-row embedding);
building first and comparing shapes after meant a traceback, or a machine out of memory, for a
file that holds a small model. The model the config describes is built on the meta device (shapes
only, no memory), and every tensor the file holds must have its shape.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from anchormass.errors import AnchorMassError, CheckpointError


def check_claimed_shapes(ckpt: Any, path: str | os.PathLike) -> None:
    """CheckpointError (one line) when the model `ckpt`'s model_config describes does not have the
    shapes of the weights it holds. A file without the usual keys is left to the loader's checks."""
    from anchormass.models import build_model
    from anchormass.models.config import ModelConfig
    from anchormass.training.checkpoint import model_state

    hparams = ckpt.get("hyper_parameters") if isinstance(ckpt, dict) else None
    config = hparams.get("model_config") if isinstance(hparams, dict) else None
    if not isinstance(config, dict) or not isinstance(ckpt.get("state_dict"), dict):
        return
    try:
        with torch.device("meta"):
            model = build_model(ModelConfig.from_dict(config))
    except AnchorMassError as err:
        raise CheckpointError(f"{path}: its model_config is not a model ({err})") from None
    held = model_state(ckpt)
    for name, want in model.state_dict().items():
        have = held.get(name)
        if isinstance(have, torch.Tensor) and tuple(have.shape) != tuple(want.shape):
            raise CheckpointError(f"{path}: its model_config describes {name} of shape {tuple(want.shape)}, but the "
                                  f"file holds one of shape {tuple(have.shape)}; refusing to build a model it does "
                                  f"not hold (model_config: vocab_size={config.get('vocab_size')}, "
                                  f"d_model={config.get('d_model')}, n_layers={config.get('n_layers')})")
