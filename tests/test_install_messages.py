"""Advice that fits the install it is printed in: a missing extra is one line naming it (the pinned
set in a checkout), and commands and documents are named as this install has them
(tests/test_install.py runs the installed wheel itself)."""

from __future__ import annotations

import tomllib

import pytest

from anchormass import command_names, extras
from anchormass.commands import train

from _train_helpers import REPO


def test_a_missing_extra_is_one_line_naming_it(monkeypatch):
    monkeypatch.setattr(extras, "_installed", lambda module: module != "tensorboard")
    with pytest.raises(extras.MissingExtra) as err:
        extras.check_choices(["model=standard_tiny", "logger=csv,tensorboard"])
    assert str(err.value) == "logger=tensorboard needs tensorboard, not installed: pip install -r requirements.txt"
    extras.check_choices(["logger=wandb", "hydra/sweeper=basic"])  # installed, or needing nothing
    monkeypatch.setattr(extras, "CHECKOUT", None)
    monkeypatch.setattr(extras, "_installed", lambda module: False)
    with pytest.raises(extras.MissingExtra, match=r"^hydra/sweeper=optuna_optim needs optuna, hydra_optuna_sweeper, "
                                                  r"not installed: pip install 'anchormass\[sweep\]'$"):
        extras.check_choices(["-m", "hydra/sweeper=optuna_optim"])


def test_extras_match_pyproject():
    """Every extra the messages name is one pip can install, and brings the modules checked for."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras.EXTRAS) <= set(declared)
    requirements = (REPO / "requirements.txt").read_text().lower()
    for extra, modules in extras.EXTRAS.items():
        for spec in declared[extra]:
            name = spec.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip().lower()
            assert name == "anchormass" or name in ("protobuf", "jinja2", "tokenizers") or \
                f"\n{name}==" in requirements, f"[{extra}] {spec} is not in the pinned set"


def test_help_and_advice_name_this_installs_commands():
    installed = command_names.for_this_install(train.__doc__, checkout=None)
    assert "python train.py" not in installed and "anchormass-train -m hydra/sweeper=optuna_optim" in installed
    assert "anchormass/configs/hydra/" in installed
    doc = command_names.for_this_install("see docs/method.md §6 and docs/training.md#sweeps", checkout=None)
    assert doc == 'see the "Method" document §6 and the "Training" guide'
    assert command_names.for_this_install(train.__doc__) == train.__doc__  # the checkout's own words
    assert command_names.command("scripts/prepare_data.py", checkout=None) == "anchormass-prepare"
    assert command_names.command("scripts/prepare_data.py", checkout=REPO) == "python scripts/prepare_data.py"


def test_relative_paths_are_taken_from_the_current_folder_in_every_command(tmp_path, monkeypatch):
    """prepare_data writes data/<name> where train.py then reads it: both from the current folder
    (before, in a checkout, prepare_data wrote into the checkout while train.py read ./data)."""
    from anchormass.errors import DataError
    from anchormass.path_checks import check_data_out_dir
    from anchormass.runs.launch_checks import data_metadata
    from anchormass.utils import resolve_path

    monkeypatch.chdir(tmp_path)
    assert resolve_path("data/demo") == check_data_out_dir("data/demo") == tmp_path / "data" / "demo"
    with pytest.raises(DataError, match=f"no prepared data folder data/demo .*current folder, {tmp_path}\\)"):
        data_metadata("data/demo")
