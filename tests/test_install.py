"""`pip install .` gives a package that works outside the checkout: a wheel built from the repository
(configs/ inside it) is installed into a fresh venv, and its console scripts prepare data, train a
2-step stage, run a passkey evaluation and export, from a folder that is not the checkout.

The venv reuses this environment's installed dependencies through a .pth file naming its
site-packages: a .pth line adds the folder only, so this environment's editable install of the
checkout (a .pth / import hook inside that folder) is not picked up, and `anchormass` comes from
the wheel alone. No network: pip runs with --no-index and --no-build-isolation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a wheel is built from: the repository's packaging files and package folders.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "anchormass", "configs", "hydra_plugins")
TINY_DATA = ["data.source.params.n_docs=30", "data.source.params.min_sentences=40",
             "data.source.params.max_sentences=80", "data.tokenizer.vocab_size=400"]
TINY_STAGE = ["model=standard_tiny", "stage.seq_len=64", "stage.total_steps=2", "stage.global_batch_size=2",
              "stage.micro_batch_size=2", "stage.warmup_steps=1", "stage.val_every=2", "stage.val_batches=1",
              "stage.ckpt_every=2", "stage.datamodule.num_workers=0", "trainer.enable_progress_bar=false",
              "torch_threads=1"]
TINY_PASSKEY = ["suite=passkey", "eval=cpu_tiny", "eval.passkey.lengths=[160]", "eval.passkey.depths=[0.5]",
                "eval.passkey.robustness=null", "progress=false"]


def run(cmd: list, cwd: Path, env: dict, timeout: float = 180) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{cmd[0]} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r


def build_wheel(dest: Path, env: dict) -> Path:
    src = dest / "src"  # a copy: building in place would leave build/ in the checkout
    src.mkdir(parents=True)
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "--quiet",
         "-w", dest / "dist", src], dest, env)
    (wheel,) = (dest / "dist").glob("anchormass-*.whl")
    return wheel


def fresh_venv(path: Path, wheel: Path, env: dict) -> Path:
    run([sys.executable, "-m", "venv", "--without-pip", path], path.parent, env)
    python = path / "bin" / "python"
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    path.parent, env).stdout.strip())
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "reused_dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", wheel], path.parent, env)
    return path / "bin"


@pytest.mark.slow
def test_wheel_installs_and_its_console_scripts_run_outside_the_checkout(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    wheel = build_wheel(tmp_path / "build", env)
    bin_dir = fresh_venv(tmp_path / "venv", wheel, env)
    work = tmp_path / "work"
    work.mkdir()

    # The package and its configs come from the venv, and a preset resolves from any folder.
    probe = run([bin_dir / "python", "-c",
                 "import anchormass, json; from anchormass.utils import CONFIG_ROOT, REPO_ROOT, CHECKOUT; "
                 "from anchormass.models import build_model; build_model('standard_tiny'); "
                 "print(json.dumps([anchormass.__file__, str(CONFIG_ROOT), str(REPO_ROOT), CHECKOUT]))"],
                work, env)
    package, config_root, repo_root, checkout = json.loads(probe.stdout)
    assert Path(package).is_relative_to(tmp_path / "venv") and Path(config_root).is_relative_to(tmp_path / "venv")
    assert (Path(config_root) / "train.yaml").is_file() and Path(repo_root) == work and checkout is None

    # --help lists the installed configs' presets and names the command that was run.
    helped = run([bin_dir / "anchormass-train", "--help"], work, env)
    assert "standard_tiny" in helped.stdout and "anchormass-train -sc install=bash" in helped.stdout

    # Defaults that are relative (data/demo, runs/...) land in the working folder.
    run([bin_dir / "anchormass-prepare", "data=demo", *TINY_DATA], work, env)
    assert (work / "data" / "demo" / "meta.json").is_file()
    trained = run([bin_dir / "anchormass-train", *TINY_STAGE], work, env)
    last = work / "runs" / "default" / "standard_tiny" / "pretrain_1k" / "checkpoints" / "last.ckpt"
    assert last.is_file() and "done: step 2" in trained.stdout
    assert (last.parents[1] / "train.log").is_file()  # Hydra's job log, named after the command as before

    run([bin_dir / "anchormass-eval", *TINY_PASSKEY, f"ckpt={last}", "out_dir=eval"], work, env)
    results = json.loads((work / "eval" / "results.json").read_text())
    assert "passkey" in results["suites"]

    exported = run([bin_dir / "anchormass-export", f"ckpt={last}", "out=export"], work, env)
    assert json.loads(exported.stdout)["format"] == "llama" and (work / "export" / "config.json").is_file()
    assert sorted(p.name for p in work.iterdir()) == ["data", "eval", "export", "runs"]
