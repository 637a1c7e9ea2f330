"""The two matched models (docs/method.md §1): `build_model(name | ModelConfig | dict | DictConfig)`."""

from __future__ import annotations

from anchormass.models.config import ModelConfig, load_model_config
from anchormass.models.transformer import LanguageModel


def build_model(spec) -> LanguageModel:
    """A freshly initialised model from a preset name, YAML path, mapping, DictConfig or ModelConfig.

    Parameters are created on the current default device (`with torch.device("meta"): ...`
    builds one without allocating memory).
    """
    return LanguageModel(load_model_config(spec))


__all__ = ["ModelConfig", "LanguageModel", "build_model", "load_model_config"]
