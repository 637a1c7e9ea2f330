"""A `train.py` launch composes its config once before Hydra (runs/launch.py: the checks, the
run folder's claim and a launcher's rerun check all read that one composition); Hydra's own
compositions for the run follow. Counted in-process, with the training itself stubbed."""

from __future__ import annotations

import sys

import hydra
import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl

from _train_helpers import FAST, tiny_datasets


@pytest.fixture
def counted(monkeypatch):
    """Calls of hydra.compose (ours) and of Hydra's config loader (every composition, Hydra's own too)."""
    calls = {"compose": 0, "load_configuration": 0}

    def counting(owner, name):
        real = getattr(owner, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    counting(hydra, "compose")
    counting(ConfigLoaderImpl, "load_configuration")
    return calls


def test_a_launch_composes_its_config_once_before_hydra(counted, monkeypatch, tmp_path, capsys):
    from anchormass.commands import train as command
    from anchormass.runs import train as run

    data = tiny_datasets(tmp_path / "data")["pretrain"]
    trained = []
    monkeypatch.setattr(run, "train", lambda cfg: trained.append(cfg) or {
        "global_step": 2, "last_checkpoint": None, "metrics": {"val/loss": 1.0}, "completed": True})
    monkeypatch.setattr(sys, "argv", ["train.py", *FAST, f"data_dir={data}", f"hydra.run.dir={tmp_path / 'run'}"])
    command.cli()
    assert len(trained) == 1 and "done: step 2" in capsys.readouterr().out
    # Hydra composes twice itself (to read the run mode, then for the run): 3 in all, 4 before launch.py
    assert counted == {"compose": 1, "load_configuration": 3}
