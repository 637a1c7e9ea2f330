"""The multi-stage curriculum: a plan of `train.py` runs (model x stage) chained by `init_from`.

A curriculum (configs/curriculum/<name>.yaml, the `curriculum` group of scripts/run_curriculum.py)
lists models, stages (each with its dataset, seeded from an earlier stage's last checkpoint) and
the closing evaluations. Runs land in `runs/<curriculum>/<model>/<stage>/`, each with its whole
output in `train.log`. Re-running the same command continues where it stopped: finished stages
(train_result.json at the stage's total steps) are skipped, an interrupted one resumes exactly
from its own last.ckpt.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from anchormass.errors import ConfigError
from anchormass.training.logged_process import run_logged
from anchormass.training.progress import PROGRESS_FILE
from anchormass.training.run import RESULT_FILE
from anchormass.training.stage_console import StageConsole, Task
from anchormass.utils import CONFIG_ROOT, REPO_ROOT

DATA_CONFIG_DIR = CONFIG_ROOT / "data"
LOG_FILE = "train.log"
# Every stage runs with these: its complete output (all levels, no progress bar) goes to its log
# file, and its progress to a small file the runner shows as a live line.
STAGE_CONSOLE_ARGS = ["verbose=2", "hydra/job_logging=stdout", "trainer.enable_progress_bar=false",
                      "++callbacks.progress_file._target_=anchormass.training.progress.ProgressFile"]


@dataclass
class StageRun:
    model: str
    stage: str
    out_dir: Path
    init_from: Path | None
    args: list[str] = field(default_factory=list)  # train.py overrides

    @property
    def log_path(self) -> Path:
        return self.out_dir / LOG_FILE

    @property
    def last_ckpt(self) -> Path:
        return self.out_dir / "checkpoints" / "last.ckpt"

    def result(self) -> dict | None:
        path = self.out_dir / RESULT_FILE
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    def is_done(self) -> bool:
        res = self.result()
        return bool(res) and res.get("global_step") == res.get("total_steps") and self.last_ckpt.is_file()


def check_curriculum(cfg: DictConfig) -> DictConfig:
    """The keys every curriculum needs, and a side-by-side count that is a whole number >= 1."""
    for key in ("name", "models", "stages"):
        if cfg.get(key) is None:
            raise ConfigError(f"the curriculum lacks '{key}'")
    for s in cfg.stages:
        if "stage" not in s or "data" not in s:
            raise ConfigError(f"curriculum {cfg.name}: every stage entry needs 'stage' and 'data', got {dict(s)}")
    parallel = cfg.get("parallel", 1)
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ConfigError(f"curriculum.parallel must be a whole number of models >= 1, got {parallel!r}")
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


# scripts/run_curriculum.py's own settings; every other command-line override is for train.py.
RUNNER_KEYS = ("curriculum", "runs_root", "evaluate", "verbose")
# Hydra settings that belong to the stages: the launcher that runs each train.py (e.g. on Slurm).
STAGE_HYDRA_PREFIXES = ("hydra/launcher=", "hydra.launcher.")


def stage_overrides(task: list[str], hydra: list[str]) -> list[str]:
    """The runner's command-line overrides (Hydra's task and hydra lists) that go to every stage."""
    own = [o for o in task if o.lstrip("+~").split("=", 1)[0].split(".", 1)[0] in RUNNER_KEYS]
    return [o for o in task if o not in own] + [o for o in hydra if o.lstrip("+~").startswith(STAGE_HYDRA_PREFIXES)]


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
                    f"trainer={cfg.get('trainer', 'cpu')}", f"run_name={cfg.name}", f"hydra.run.dir={out}",
                    *STAGE_CONSOLE_ARGS]
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


def finished_text(run: StageRun, seconds: float) -> str:
    res = run.result() or {}
    metrics = res.get("metrics", {})
    loss, val = metrics.get("train/loss"), metrics.get("val/loss")
    return (f"done    {res.get('global_step', '?')} steps  loss {loss:.4f}" if loss is not None else "done") + (
        f"  val {val:.4f}" if val is not None else "") + f"  {seconds:.0f} s"


def _run_chain(chain: list[StageRun], console: StageConsole, label) -> int:
    """One model's stages in order; returns the first non-zero exit code (0 when all ran)."""
    for run in chain:
        task = Task(label(run), run.log_path, progress_dir=run.out_dir)
        if run.is_done():
            console.post("skipped", task, message="skipped (already done)")
            continue
        (run.out_dir / PROGRESS_FILE).unlink(missing_ok=True)  # an earlier attempt's records would show as live
        console.post("started", task)
        echo = (lambda line, t=task: console.post("line", t, text=line)) if console.verbose >= 2 else None
        t0 = time.perf_counter()
        rc = run_logged(command(run), run.log_path, echo=echo)
        if rc != 0:
            console.post("failed", task, message=f"exit {rc} after {time.perf_counter() - t0:.0f} s; "
                                                 f"rerun the same command to resume")
            return rc
        console.post("finished", task, message=finished_text(run, time.perf_counter() - t0))
    return 0


def execute(runs: list[StageRun], parallel: int = 1, console: StageConsole | None = None) -> list[dict]:
    """Run every stage as a train.py subprocess whose output goes to its log file. Each model's
    stages run in order; with parallel > 1 up to that many models train side by side (a 2-core
    machine runs two 1-thread chains faster than one 2-thread chain). Exits with the first
    failure's code once every chain has stopped."""
    console = console or StageConsole()
    chains: dict[str, list[StageRun]] = {}
    for run in runs:
        chains.setdefault(run.model, []).append(run)
    wm, ws = max(len(r.model) for r in runs), max(len(r.stage) for r in runs)

    def label(run: StageRun) -> str:  # aligned columns across both models' lines
        return f"{run.model:<{wm}}  {run.stage:<{ws}}"

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = [pool.submit(_run_chain, chain, console, label) for chain in chains.values()]
        console.follow(futures)
    failed = [f.result() for f in futures if f.result()]
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
