"""Shared by the tests/test_train_*.py files: a tiny prepared demo dataset and test-only callbacks."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from lightning.pytorch.callbacks import Callback
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(REPO / "configs")
_PREPARED: dict[str, Path] = {}

# Small and fast everywhere: 2 steps of 2 x 64 tokens unless a test says otherwise.
FAST = ["stage.seq_len=64", "stage.total_steps=2", "stage.global_batch_size=2", "stage.micro_batch_size=2",
        "stage.warmup_steps=1", "stage.val_every=2", "stage.val_batches=1", "stage.ckpt_every=2",
        "stage.datamodule.num_workers=0", "logger=none", "trainer.enable_progress_bar=false", "torch_threads=1"]
# The run every kill / stop / resume test compares against (conftest.py's `reference`, trained once):
# 6 optimizer steps of 2 micro-batches (a stop can land mid-accumulation), validation and periodic
# checkpoints every 2 steps, one CSV row per step.
REFERENCE = ["model=anchormass_tiny", *FAST, "stage.total_steps=6", "stage.global_batch_size=4",
             "stage.micro_batch_size=2", "stage.val_every=2", "stage.ckpt_every=2", "logger=csv",
             "trainer.log_every_n_steps=1"]


def tiny_datasets(base: Path) -> dict[str, Path]:
    """Prepare (once per test session) a small demo corpus, a chat SFT set and a long-context set;
    folders another test worker prepared under `base` already are used as they are."""
    if _PREPARED:
        return _PREPARED
    pre, chat, longctx = base / "demo", base / "demo_chat", base / "longctx"
    if all((d / "meta.json").is_file() for d in (pre, chat, longctx)):
        _PREPARED.update(pretrain=pre, chat=chat, longctx=longctx)
        return _PREPARED
    from anchormass.data.prepare import prepare

    def load(name: str, **changes) -> dict:
        cfg = OmegaConf.merge(OmegaConf.load(REPO / "configs" / "data" / f"{name}.yaml"), changes)
        return OmegaConf.to_container(cfg, resolve=True)

    prepare(load("demo", out_dir=str(pre), source={"params": {"n_docs": 30, "min_sentences": 40,
                                                               "max_sentences": 80}},
                 tokenizer={"vocab_size": 400}))
    prepare(load("demo_chat", out_dir=str(chat), source={"params": {"n": 120}},
                 tokenizer={"path": str(pre / "tokenizer.model")}))
    prepare(load("demo_longctx", out_dir=str(longctx),
                 longctx={"source_dir": str(pre), "length": 257, "n_facts": 2, "n_train": 16, "n_val": 4}))
    _PREPARED.update(pretrain=pre, chat=chat, longctx=longctx)
    return _PREPARED


def stage_data(stage: str, data: dict[str, Path]) -> Path:
    if stage.startswith("longctx"):
        return data["longctx"]
    return data["chat"] if stage == "chat_sft" else data["pretrain"]


def compose_train(overrides: list[str], out_dir: Path):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("train", overrides=[*overrides, f"output_dir={out_dir}"])


def train_cmd(overrides: list[str], out_dir: Path) -> list[str]:
    return [sys.executable, str(REPO / "train.py"), *overrides, f"hydra.run.dir={out_dir}"]


def subprocess_env() -> dict:
    # Test callbacks (below) must be importable by train.py subprocesses.
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), str(REPO)]),
            "WANDB_MODE": "offline"}


def run_train(overrides: list[str], out_dir: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(train_cmd(overrides, out_dir), cwd=REPO, env=subprocess_env(), capture_output=True,
                          text=True, timeout=timeout)


def run_cli(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    """The single `error:` line a refused command ends with (exit 2, no traceback)."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr[-3000:]  # progress bars may come before
    return errors[0]


# Columns whose values are wall-clock measurements, not results.
TIMING = ("perf/tokens_per_s",)


def csv_rows(out: Path) -> list[tuple]:
    """A run's metrics.csv as (step, sorted non-empty result columns) rows, in file order."""
    with open(out / "logs" / "metrics.csv", newline="") as fh:
        return [(int(row["step"]), tuple(sorted((k, v) for k, v in row.items() if v and k not in TIMING)))
                for row in csv.DictReader(fh)]


def model_params(ckpt_path: Path) -> dict[str, torch.Tensor]:
    state = torch.load(ckpt_path, map_location="cpu", weights_only=False)["state_dict"]
    return {k: v for k, v in state.items() if k.startswith("model.")}


class PoisonAt(Callback):
    """Test hook: after optimizer step `step`, fill one weight with NaN (a diverged run)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            with torch.no_grad():
                pl_module.model.lm_head.weight.fill_(float("nan"))


class SleepAfter(Callback):
    """Test hook: sleep after each optimizer step past `step`, so a SIGKILL lands mid-run."""

    def __init__(self, step: int, seconds: float):
        self.step, self.seconds = step, seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step:
            time.sleep(self.seconds)


class WaitForStop(Callback):
    """Test hook: before training the step after `step`, wait (at most `seconds`) until a stop signal
    has reached the run's PreemptCheckpoint. Step `step`'s checkpoint is on disk by then, so a test
    that signals once it appears has its stop land at step `step + 1`, however loaded the machine
    and whatever order the callbacks run in: no sleep races the signal."""

    def __init__(self, step: int, seconds: float = 120.0):
        self.step, self.seconds = step, seconds

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step < self.step:
            return
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline and not any(getattr(cb, "received", None) is not None
                                                      for cb in trainer.callbacks):
            time.sleep(0.02)


class WeightsAtStart(Callback):
    """Test hook: save the model's weights to `path` when training starts (before step 0)."""

    def __init__(self, path: str):
        self.path = path

    def on_train_start(self, trainer, pl_module) -> None:
        torch.save({k: v.detach().clone() for k, v in pl_module.model.state_dict().items()}, self.path)
