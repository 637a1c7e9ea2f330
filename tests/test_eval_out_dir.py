"""One evaluation per out_dir: a second evaluate.py into the folder another one is writing is
refused in one line, and so is a finished out_dir, both before any model is loaded (before, the
second deleted the first's staging folder and died after its work with a traceback)."""

import pytest
from hydra import compose, initialize_config_dir

from anchormass.dir_lock import DirLock
from anchormass.errors import ConfigError
from anchormass.eval import runner

from _train_helpers import CONFIG_DIR


def evaluate_config(out_dir):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("evaluate", overrides=["suite=profile", "model=standard_tiny", f"out_dir={out_dir}",
                                              "progress=false"])


@pytest.fixture
def no_model_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("models were loaded before the out_dir was checked")

    monkeypatch.setattr(runner, "load_models", refuse)


def test_a_second_evaluation_into_a_busy_out_dir_is_refused_before_loading(tmp_path, no_model_loading):
    out = tmp_path / "eval"
    with DirLock(tmp_path / ".eval.lock", what="the first evaluation"):   # as the first evaluate.py holds it
        with pytest.raises(ConfigError, match=r"evaluation out_dir .*eval is in use by another process \(pid \d+"):
            runner.run_evaluation(evaluate_config(out))
    assert not out.exists() and not (tmp_path / ".eval.partial").exists()


def test_a_finished_out_dir_is_refused_before_loading(tmp_path, no_model_loading):
    out = tmp_path / "eval"
    out.mkdir()
    (out / "results.json").write_text("{}")
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        runner.run_evaluation(evaluate_config(out))
    assert not (tmp_path / ".eval.lock").exists()   # the refused run let go of the lock
