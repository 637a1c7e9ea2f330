"""Sweeps and launchers through Hydra plugins: an Optuna search on validation loss, and the
submitit launcher (the Slurm code path) run locally on CPU."""

import json
import subprocess
import sys

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from _train_helpers import CONFIG_DIR, FAST, REPO, subprocess_env

SEARCHED = {"optim.lr", "optim.warmup_steps", "optim.weight_decay"}


def train_py(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(REPO / "train.py"), *args], cwd=REPO, env=subprocess_env(),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def overrides_of(job_dir) -> dict[str, str]:
    return dict(o.split("=", 1) for o in yaml.safe_load((job_dir / ".hydra" / "overrides.yaml").read_text()))


@pytest.mark.slow
def test_optuna_sweep_finds_and_writes_the_best_trial(data, tmp_path):
    sweep = tmp_path / "sweep"
    train_py(["-m", "hydra/sweeper=optuna_optim", "hydra.sweeper.n_trials=3", f"hydra.sweep.dir={sweep}",
              f"data_dir={data['pretrain']}", *FAST])
    trials = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [t.name for t in trials] == ["0", "1", "2"]
    val = {t.name: json.loads((t / "train_result.json").read_text())["metrics"]["val/loss"] for t in trials}
    tried = {t.name: overrides_of(t) for t in trials}
    assert all(SEARCHED <= set(o) for o in tried.values())
    assert len({o["optim.lr"] for o in tried.values()}) == 3  # three different points were tried
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    winner = min(val, key=val.get)
    assert best["best_value"] == pytest.approx(val[winner])
    assert set(best["best_params"]) == SEARCHED
    for key, value in best["best_params"].items():
        assert float(tried[winner][key]) == pytest.approx(float(value))
    # The searched learning rate reached the optimiser (it overrides the stage's default).
    cfg = OmegaConf.load(sweep / winner / ".hydra" / "config.yaml")
    assert cfg.optim.lr == pytest.approx(best["best_params"]["optim.lr"])


def test_sweeper_and_slurm_configs_compose(tmp_path):
    """The shipped search space and Slurm resources follow the run's own settings."""
    import anchormass.cli  # noqa: F401  (registers the ${min:...} resolver, as every entry point does)

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["hydra/sweeper=optuna_optim", "hydra/launcher=slurm", "trainer=ddp",
                                          "trainer.num_nodes=2", "stage.warmup_steps=50", f"output_dir={tmp_path}"],
                      return_hydra_config=True)
    sweeper, launcher = cfg.hydra.sweeper, cfg.hydra.launcher
    assert sweeper._target_.endswith("OptunaSweeper") and sweeper.direction == "minimize"
    assert set(sweeper.params) == SEARCHED and sweeper.params["optim.warmup_steps"] == "int(interval(0, 50))"
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.nodes, launcher.gpus_per_node, launcher.tasks_per_node) == (2, 8, 8)
    assert launcher.timeout_min > 0 and "partition" in launcher


@pytest.mark.slow
def test_submitit_local_multirun_and_single_run(data, tmp_path):
    sweep = tmp_path / "sweep"
    train_py(["-m", "hydra/launcher=submitit_local", "model=standard_tiny,anchormass_tiny",
              f"hydra.sweep.dir={sweep}", f"data_dir={data['pretrain']}", *FAST])
    for job, model in (("0", "standard_tiny"), ("1", "anchormass_tiny")):
        res = json.loads((sweep / job / "train_result.json").read_text())
        assert (res["model"], res["global_step"]) == (model, 2)
        assert (sweep / job / "checkpoints" / "last.ckpt").is_file()
    assert len(list((sweep / ".submitit").glob("*/*_result.pkl"))) == 2  # both ran as submitit jobs

    # Without -m, a launcher runs the one job in the run folder a plain run would use (how the
    # curriculum's stages reach Slurm).
    out = tmp_path / "single"
    train_py(["hydra/launcher=submitit_local", f"hydra.run.dir={out}", f"data_dir={data['pretrain']}", *FAST])
    assert json.loads((out / "train_result.json").read_text())["global_step"] == 2
    assert list((out / ".submitit").glob("*/*_result.pkl"))
