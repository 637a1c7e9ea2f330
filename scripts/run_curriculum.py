"""Run a whole training curriculum for both models, then the comparison report.

    python scripts/run_curriculum.py                      # the miniature (configs/curriculum/mini.yaml)
    python scripts/run_curriculum.py curriculum=full_158m trainer=ddp trainer.devices=8

Options (configs/run_curriculum.yaml): curriculum=<name>, runs_root=<dir>, evaluate=false,
verbose=0|1|2, curriculum.models=[a,b], curriculum.parallel=<n>. Every other override is a
train.py override and goes to each stage. Rerunning the same command resumes.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from anchormass.cli import check_group_choices, exit_on_error
from anchormass.errors import ConfigError, DataError
from anchormass.logging_setup import check_verbose
from anchormass.training.curriculum import StageRun, check_curriculum, datasets, execute, plan, stage_overrides
from anchormass.training.logged_process import run_logged
from anchormass.training.stage_console import StageConsole, Task, shown
from anchormass.utils import CONFIG_ROOT, REPO_ROOT, atomic_write_json, resolve_path

def run_step(console: StageConsole, label: str, cmd: list[str], log: Path, finished: str) -> None:
    """A data preparation or report process: its output to `log`, one line when it is done."""
    task = Task(label, log)
    t0 = time.perf_counter()
    rc = run_logged(cmd, log, echo=(lambda line: console.print(f"[{label}] {line}")) if console.verbose >= 2 else None)
    if rc != 0:
        console.failure(task, f"exit {rc}")
        raise SystemExit(rc)
    if console.verbose >= 1:
        console.print(f"{label}  {finished} in {time.perf_counter() - t0:.0f} s")


def prepare_data(cur: DictConfig, logs: Path, console: StageConsole) -> None:
    """Prepare each dataset the curriculum reads whose folder is missing (the demo ones: seconds)."""
    for args, folder in datasets(cur):
        if (folder / "meta.json").is_file():
            continue
        log = logs / f"prepare_{folder.name}.log"
        try:
            run_step(console, f"data {shown(folder)}", [sys.executable, str(REPO_ROOT / "scripts" / "prepare_data.py"),
                                                         *args], log, "prepared")
        except SystemExit:
            raise DataError(f"preparing {shown(folder)} failed; its log: {shown(log)}") from None


def evaluate(cur: DictConfig, runs: list[StageRun], root: Path, console: StageConsole) -> list[Path]:
    """The closing comparison: models[0] vs models[1] at each listed stage, via evaluate.py."""
    reports = []
    by_key = {(r.model, r.stage): r for r in runs}
    for entry in cur.get("evaluate") or []:
        a, b = (by_key[(str(m), entry.stage)] for m in cur.models[:2])
        out = root / "report" / str(entry.name)
        cmd = [sys.executable, str(REPO_ROOT / "evaluate.py"), f"ckpt={a.last_ckpt}", f"compare_ckpt={b.last_ckpt}",
               f"out_dir={out}", "overwrite=true", *list(entry.get("overrides") or [])]
        if console.verbose >= 1:
            console.print(f"report {entry.name}: {a.model} vs {b.model} at {entry.stage} ...")
        run_step(console, f"report {entry.name}", cmd, root / "logs" / f"report_{entry.name}.log", "written")
        reports.append(out / "report.md")
    return reports


def print_summary(console: StageConsole, summary: list[dict]) -> None:
    def fmt(x):
        return f"{x:.4f}" if isinstance(x, float) else "-"

    wm, ws = max(len(r["model"]) for r in summary), max(len(r["stage"]) for r in summary)
    console.print(f"\n{'model':<{wm}}  {'stage':<{ws}}  {'step':>5}  {'train loss':>10}  {'val loss':>8}")
    for row in summary:
        console.print(f"{row['model']:<{wm}}  {row['stage']:<{ws}}  {row['global_step'] or 0:>5}  "
                      f"{fmt(row['train_loss']):>10}  {fmt(row['val_loss']):>8}")


@hydra.main(version_base="1.3", config_path=str(CONFIG_ROOT), config_name="run_curriculum")
@exit_on_error
def main(cfg: DictConfig) -> None:
    t0 = time.perf_counter()
    console = StageConsole(verbose=check_verbose(cfg.verbose))
    cur = check_curriculum(cfg.curriculum)
    if not isinstance(cfg.evaluate, bool):
        raise ConfigError(f"evaluate must be true or false, got {cfg.evaluate!r}")
    if cfg.evaluate and cur.get("evaluate") and len(cur.models) < 2:  # refuse now, not after the training
        raise ConfigError(f"the closing comparison needs two models, got curriculum.models="
                          f"[{','.join(map(str, cur.models))}]; pass two models or evaluate=false")
    root = resolve_path(cfg.runs_root) / str(cur.name)
    overrides = HydraConfig.get().overrides
    runs = plan(cur, root.parent, stage_overrides(list(overrides.task), list(overrides.hydra)))
    prepare_data(cur, root / "logs", console)
    summary = execute(runs, parallel=int(cur.get("parallel", 1)), console=console)
    reports = evaluate(cur, runs, root, console) if cfg.evaluate else []
    wall = time.perf_counter() - t0
    atomic_write_json(root / "curriculum.json", {"curriculum": str(cur.name), "wall_time_s": round(wall, 1),
                                                 "stages": summary, "reports": [str(r) for r in reports]},
                      sort_keys=True, indent=2)
    print_summary(console, summary)
    console.print(f"curriculum {cur.name}: {wall:.0f} s; summary {shown(root / 'curriculum.json')}")
    for r in reports:
        console.print(f"report: {shown(r)}")


if __name__ == "__main__":
    check_group_choices(CONFIG_ROOT, sys.argv[1:])
    main()
