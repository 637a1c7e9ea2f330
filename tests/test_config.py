import pytest

from anchormass.errors import ConfigError
from anchormass.models.config import ModelConfig, available_presets, load_model_config


def test_every_preset_loads():
    names = available_presets()
    for size in ("158m", "mini", "tiny"):
        for arch in ("standard", "anchormass"):
            assert f"{arch}_{size}" in names
            cfg = load_model_config(f"{arch}_{size}")
            assert cfg.arch == arch


@pytest.mark.parametrize(
    "changes, fragment",
    [
        (dict(n_local_heads=3, n_global_heads=3), "must equal n_heads"),
        (dict(block_size=60), "multiple of group_size"),
        (dict(head_dim=63, n_heads=1, d_model=63), "even"),
        (dict(n_heads=6), "must equal d_model"),
        (dict(slot_policy="lru"), "slot_policy"),
        (dict(arch="mamba"), "arch"),
        (dict(merge_weighting="norm"), "merge_weighting"),
    ],
)
def test_inconsistent_configs_are_rejected(changes, fragment):
    base = load_model_config("anchormass_tiny").to_dict()
    with pytest.raises(ConfigError, match=fragment):
        ModelConfig.from_dict({**base, **changes})


def test_unknown_field_and_unknown_preset():
    with pytest.raises(ConfigError, match="unknown field"):
        ModelConfig.from_dict({"n_layerz": 3})
    with pytest.raises(ConfigError, match="unknown model"):
        load_model_config("no_such_model")
