"""The multi-stage curriculum: a plan of `train.py` runs (model x stage) chained by `init_from`.

A curriculum file (configs/curriculum/<name>.yaml) lists models, stages (each with its dataset,
seeded from an earlier stage's last checkpoint) and the closing evaluations. Runs land in
`runs/<curriculum>/<model>/<stage>/`. Re-running the same command continues where it stopped:
finished stages (train_result.json at the stage's total steps) are skipped, an interrupted one
resumes exactly from its own last.ckpt.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from anchormass.errors import ConfigError
from anchormass.training.run import RESULT_FILE
from anchormass.utils import CONFIG_ROOT, REPO_ROOT

CURRICULUM_DIR = CONFIG_ROOT / "curriculum"
DATA_CONFIG_DIR = CONFIG_ROOT / "data"


@dataclass
class StageRun:
    model: str
    stage: str
    out_dir: Path
    init_from: Path | None
    args: list[str] = field(default_factory=list)  # train.py overrides

    @property
    def last_ckpt(self) -> Path:
        return self.out_dir / "checkpoints" / "last.ckpt"

    def result(self) -> dict | None:
        path = self.out_dir / RESULT_FILE
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    def is_done(self) -> bool:
        res = self.result()
        return bool(res) and res.get("global_step") == res.get("total_steps") and self.last_ckpt.is_file()


def load_curriculum(name_or_path: str) -> DictConfig:
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = CURRICULUM_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in CURRICULUM_DIR.glob("*.yaml")))
        raise ConfigError(f"unknown curriculum '{name_or_path}' (no {path}); known: {known}")
    cfg = OmegaConf.load(path)
    for key in ("name", "models", "stages"):
        if key not in cfg:
            raise ConfigError(f"curriculum {path} lacks '{key}'")
    for s in cfg.stages:
        if "stage" not in s or "data" not in s:
            raise ConfigError(f"curriculum {path}: every stage entry needs 'stage' and 'data', got {dict(s)}")
    return cfg


def datasets(cfg: DictConfig) -> list[tuple[list[str], Path]]:
    """Each distinct dataset the curriculum reads: (prepare_data.py arguments, prepared folder)."""
    out: dict[Path, list[str]] = {}
    for s in cfg.stages:
        path = DATA_CONFIG_DIR / f"{s.data}.yaml"
        if not path.is_file():
            raise ConfigError(f"curriculum {cfg.name}: stage {s.stage} reads unknown data '{s.data}' (no {path})")
        overrides = list(s.get("data_overrides") or [])
        data = OmegaConf.merge(OmegaConf.load(path),
                               OmegaConf.from_dotlist([o.removeprefix("data.") for o in overrides]))
        folder = REPO_ROOT / str(data.get("out_dir") or f"data/{data.name}")
        out.setdefault(folder, [f"data={s.data}", *overrides])
    return [(args, folder) for folder, args in out.items()]


def merge_overrides(args: list[str]) -> list[str]:
    """Later `key=value` wins (Hydra refuses the same group twice, e.g. trainer=gpu trainer=ddp)."""
    merged: dict[str, str] = {}
    for arg in args:
        merged.pop(arg.split("=", 1)[0], None)
        merged[arg.split("=", 1)[0]] = arg
    return list(merged.values())


def plan(cfg: DictConfig, runs_root: Path, extra: list[str]) -> list[StageRun]:
    """Every (model, stage) run in order: all stages of the first model, then the next model.
    Both models get the same seed and data, so stage k feeds them identical batches."""
    names = [s.stage for s in cfg.stages]
    runs: list[StageRun] = []
    for model in cfg.models:
        done: dict[str, StageRun] = {}
        for s in cfg.stages:
            parent = s.get("init_from")
            if parent is not None and parent not in done:
                raise ConfigError(f"curriculum {cfg.name}: stage {s.stage} starts from {parent}, "
                                  f"which is not an earlier stage (order: {names})")
            out = runs_root / str(cfg.name) / str(model) / str(s.stage)
            args = [f"stage={s.stage}", f"model={model}", f"data={s.data}", *list(s.get("data_overrides") or []),
                    f"trainer={cfg.get('trainer', 'cpu')}", f"run_name={cfg.name}", f"hydra.run.dir={out}"]
            args += [f"stage.{k}={v}" for k, v in (s.get("set") or {}).items()]
            args = merge_overrides(args + list(cfg.get("overrides") or []) + list(extra))
            run = StageRun(str(model), str(s.stage), out, done[parent].last_ckpt if parent else None, args)
            done[s.stage] = run
            runs.append(run)
    return runs


def command(run: StageRun) -> list[str]:
    """The train.py call for one run: resume its own checkpoint if one exists, else start
    from the parent stage's weights."""
    cmd = [sys.executable, str(REPO_ROOT / "train.py"), *run.args]
    if run.last_ckpt.is_file():
        cmd.append(f"ckpt_path={run.last_ckpt}")
    elif run.init_from is not None:
        cmd.append(f"init_from={run.init_from}")
    return cmd


def _run_chain(chain: list[StageRun], index: dict, total: int, t_all: float, log) -> int:
    """One model's stages in order; returns the first non-zero exit code (0 when all ran)."""
    for run in chain:
        head = f"[{index[id(run)]}/{total}] {run.model} / {run.stage}"
        if run.is_done():
            log(f"{head}: already done, skipped")
            continue
        cmd = command(run)
        log(f"{head}: {' '.join(cmd[2:])}")
        t0 = time.perf_counter()
        rc = subprocess.call(cmd, cwd=REPO_ROOT)
        if rc != 0:  # train.py already printed its reason
            log(f"{head}: failed (exit {rc}); rerun the same command to resume; files in {run.out_dir}")
            return rc
        log(f"{head}: finished in {time.perf_counter() - t0:.0f} s (total {time.perf_counter() - t_all:.0f} s)")
    return 0


def execute(runs: list[StageRun], log=print, parallel: int = 1) -> list[dict]:
    """Run every stage (train.py subprocesses, output streamed). Each model's stages run in
    order; with parallel > 1 up to that many models train side by side (a 2-core machine runs
    two 1-thread chains faster than one 2-thread chain). Exits with the first failure's code."""
    t_all = time.perf_counter()
    index = {id(r): i for i, r in enumerate(runs, 1)}
    chains: dict[str, list[StageRun]] = {}
    for run in runs:
        chains.setdefault(run.model, []).append(run)
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        codes = list(pool.map(lambda c: _run_chain(c, index, len(runs), t_all, log), chains.values()))
    failed = [rc for rc in codes if rc]
    if failed:
        raise SystemExit(failed[0])
    summary = []
    for run in runs:
        res = run.result() or {}
        summary.append({"model": run.model, "stage": run.stage, "checkpoint": str(run.last_ckpt),
                        "global_step": res.get("global_step"),
                        "train_loss": res.get("metrics", {}).get("train/loss"),
                        "val_loss": res.get("metrics", {}).get("val/loss")})
    return summary
