import typing

import pytest
import yaml

from anchormass.errors import ConfigError
from anchormass.models.config import CONFIG_DIR, ModelConfig, available_presets, load_model_config, read_preset


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
        (dict(attn_impl="sdpa"), "attn_impl must be one of"),
        (dict(background_key="first"), "background_key must be one of"),
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


def test_presets_state_only_what_differs_from_their_defaults():
    """base.yaml states every field; every other preset names its defaults and changes something
    in each line it states, so a value is written in one place."""
    assert sorted(read_preset("base")) == sorted(f.name for f in ModelConfig.__dataclass_fields__.values())
    for name in available_presets():
        if name == "base":
            continue
        raw = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())
        parents = [p for p in raw.pop("defaults") if p != "_self_"]
        inherited = {k: v for p in parents for k, v in read_preset(p).items()}
        assert parents and all(inherited[k] != v for k, v in raw.items()), name


def test_a_preset_without_base_fields_is_refused_in_one_line(tmp_path):
    (tmp_path / "partial.yaml").write_text("name: partial\narch: standard\n")
    with pytest.raises(ConfigError, match="missing field"):
        load_model_config(tmp_path / "partial.yaml")


def test_enumerated_fields_are_literal_types():
    hints = typing.get_type_hints(ModelConfig)
    for field in ("arch", "slot_policy", "merge_weighting", "background_key", "attn_impl"):
        assert typing.get_origin(hints[field]) is typing.Literal, field
