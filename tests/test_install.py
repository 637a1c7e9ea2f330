"""The wheel alone: built from the repository (configs/ inside it), installed into an empty venv
with nothing of this test environment (no .pth, no --system-site-packages), and run from an empty
folder that is not the checkout: the README's flow prepare -> train -> eval -> export, each missing
extra hit once for its one-line message, then the [hf] extra installed and the export run from
another folder after the prepared data is gone (the checkpoint carries its tokenizer).

Its dependencies come from wherever pip is configured to take them: the package registry (CI has
access), with torch's CPU build from a local folder where pip is pointed at one (this machine:
/opt/wheels). So the test needs the registry: `slow`; 89 s on the shared 2-core machine at load 4.5
with pip's cache warm (249 s at load 6 with it cold), ~50 s of it pip."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
def pip_install(venv: Path, what: str, env: dict) -> None:
    """This environment's pip installs into the venv (`--python`): the venv needs no pip of its own
    (ensurepip costs ~4 s), and nothing of this environment lands in it."""
    run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "--quiet", "--no-compile",
         "--disable-pip-version-check", what], venv.parent, env, timeout=900)


def run(cmd: list, cwd: Path, env: dict, timeout: float = 300, code: int = 0) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == code, f"{cmd[0]} ended {r.returncode}:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    return r


def missing_extra(cmd: list, cwd: Path, env: dict, extra: str) -> str:
    """The command stops with exit 2 and one `error:` line naming `pip install 'anchormass[<extra>]'`."""
    stderr = run(cmd, cwd, env, code=2).stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert errors == stderr.splitlines(), stderr[-3000:]  # nothing else: no traceback, no plugin warning
    assert errors[0].endswith(f"pip install 'anchormass[{extra}]'"), errors[0]
    return errors[0]


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


@pytest.mark.slow
def test_the_wheel_alone_runs_the_readme_flow_from_an_empty_folder(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", WANDB_MODE="offline", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               ANCHORMASS_CACHE=str(tmp_path / "cache"))
    wheel = build_wheel(tmp_path / "build", env)
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, env)
    python, bin_dir = venv / "bin" / "python", venv / "bin"
    pip_install(venv, str(wheel), env)  # the core: no extra
    work, other = tmp_path / "work", tmp_path / "other"
    work.mkdir()
    other.mkdir()

    # The package, its configs and its dependencies come from the venv alone.
    probe = run([python, "-c", "import anchormass, json, importlib.util; from anchormass.utils import CONFIG_ROOT, "
                 "CHECKOUT; print(json.dumps([anchormass.__file__, importlib.util.find_spec('torch').origin, "
                 "str(CONFIG_ROOT), CHECKOUT]))"], work, env)
    package, torch_file, config_root, checkout = json.loads(probe.stdout)
    assert all(Path(p).is_relative_to(venv) for p in (package, torch_file, config_root)) and checkout is None
    listed = run([python, "-m", "anchormass"], work, env).stdout
    assert "anchormass-train" in listed and "anchormass-export" in listed
    helped = run([bin_dir / "anchormass-train", "--help"], work, env).stdout
    assert "anchormass-train -sc install=bash" in helped and "python train.py" not in helped
    assert "docs/" not in helped and "python scripts/" not in helped

    # Each missing extra: one line naming it, before anything is written.
    missing_extra([bin_dir / "anchormass-train", "logger=tensorboard"], work, env, "loggers")
    missing_extra([bin_dir / "anchormass-train", "-m", "hydra/sweeper=optuna_optim"], work, env, "sweep")
    missing_extra([bin_dir / "anchormass-train", "hydra/launcher=slurm"], work, env, "slurm")
    (work / "corpus.txt").write_text("A line of text.\n" * 50)
    missing_extra([bin_dir / "anchormass-prepare", "data=aozora", "data.source.paths=[corpus.txt]"], work, env, "data")
    (work / "corpus.txt").unlink()
    assert sorted(p.name for p in work.iterdir()) == []

    # The README's flow; relative defaults (data/demo, runs/...) land in the working folder.
    run([bin_dir / "anchormass-prepare", "data=demo", *TINY_DATA], work, env)
    assert (work / "data" / "demo" / "meta.json").is_file()
    trained = run([bin_dir / "anchormass-train", *TINY_STAGE], work, env)
    last = work / "runs" / "default" / "standard_tiny" / "pretrain_1k" / "checkpoints" / "last.ckpt"
    assert last.is_file() and "done: step 2" in trained.stdout
    run([bin_dir / "anchormass-eval", *TINY_PASSKEY, f"ckpt={last}", "out_dir=eval"], work, env)
    assert "passkey" in json.loads((work / "eval" / "results.json").read_text())["suites"]
    missing_extra([bin_dir / "anchormass-eval", "suite=[passkey,lm_eval]", f"ckpt={last}", "out_dir=eval_h"], work, env,
                  "eval")
    missing_extra([bin_dir / "anchormass-export", f"ckpt={last}", "out=export"], work, env, "hf")
    assert sorted(p.name for p in work.iterdir()) == ["data", "eval", "runs"]

    # With [hf]: the export, from another folder, once the prepared data (and its tokenizer) is gone.
    pip_install(venv, f"{wheel}[hf]", env)
    shutil.rmtree(work / "data")
    exported = run([bin_dir / "anchormass-export", f"ckpt={last}", "out=export"], other, env)
    assert json.loads(exported.stdout)["format"] == "llama" and (other / "export" / "tokenizer.json").is_file()
