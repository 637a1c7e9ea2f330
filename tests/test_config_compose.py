"""The one composition path for config files read outside Hydra (anchormass/config_compose.py): the
model presets, the eval presets and the curriculum's data configs read through it, and it composes
a group file as Hydra's compose does."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from anchormass.config_compose import compose_file
from anchormass.errors import ConfigError
from anchormass.utils import CONFIG_ROOT


def _write(folder: Path, name: str, text: str) -> None:
    (folder / f"{name}.yaml").write_text(text)


def test_defaults_merge_first_then_the_files_own_keys_where_self_stands(tmp_path):
    _write(tmp_path, "base", "a: 1\nnested: {x: 1, y: 1}\n")
    _write(tmp_path, "child", "defaults: [base, _self_]\na: 2\nnested: {y: 2}\n")
    _write(tmp_path, "self_first", "defaults: [_self_, base]\na: 2\n")
    assert OmegaConf.to_container(compose_file("child", tmp_path, "x")) == {"a": 2, "nested": {"x": 1, "y": 2}}
    assert compose_file("self_first", tmp_path, "x").a == 1  # the default after _self_ wins
    assert compose_file(tmp_path / "child.yaml", tmp_path, "x").a == 2  # a path works as a name does


@pytest.mark.parametrize("files, name, message", [
    ({}, "nope", r"unknown thing 'nope': no .*nope.yaml; presets: $"),
    ({"loop": "defaults: [loop]\n"}, "loop", "its defaults list includes itself"),
    ({"bad": "defaults: [{a: b}]\n"}, "bad", "defaults entries must be names of thing files"),
    ({"lst": "- 1\n"}, "lst", "must be a mapping"),
])
def test_bad_files_are_one_line_errors(tmp_path, files, name, message):
    for n, text in files.items():
        _write(tmp_path, n, text)
    with pytest.raises(ConfigError, match=message):
        compose_file(name, tmp_path, "thing")


@pytest.mark.parametrize("group", ["model", "eval", "data"])
def test_every_file_of_a_group_composes_as_hydra_composes_it(group):
    folder = CONFIG_ROOT / group
    with initialize_config_dir(config_dir=str(folder), version_base="1.3"):
        for path in sorted(folder.glob("*.yaml")):
            ours = OmegaConf.to_container(compose_file(path.stem, folder, group))
            theirs = OmegaConf.to_container(compose(path.stem))
            assert ours == theirs, path.name
