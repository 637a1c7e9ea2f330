"""The whole curriculum command: recipe -> plan -> data -> stages -> closing comparisons -> summary.

`scripts/run_curriculum.py` composes the config with Hydra and calls `run_curriculum`. Before
anything is written, a second launch of the same curriculum is refused (one runner per
`runs/<curriculum>/`) and a comparison that could not run is refused, not after hours of training;
so is a stage whose start file is missing (curriculum/start_files.py), before any data is prepared.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from anchormass.cli import check_override_path
from anchormass.curriculum.changes import check_changes
from anchormass.curriculum.closing import evaluate
from anchormass.curriculum.execute import curriculum_lock, execute, run_step
from anchormass.curriculum.plan import datasets, plan, stage_overrides, stage_runs
from anchormass.curriculum.recipe import Recipe, load_recipe
from anchormass.curriculum.start_files import check_start_files
from anchormass.errors import ConfigError, DataError
from anchormass.logging_setup import check_verbose
from anchormass.runs.layout import logs_dir
from anchormass.runs.preemption import TrainingInterrupted, exit_interrupted, forward_stop_signals
from anchormass.runs.stage_console import StageConsole, shown
from anchormass.utils import atomic_write_json, resolve_path


def prepare_data(recipe: Recipe, logs: Path, console: StageConsole) -> None:
    """Prepare each dataset the recipe reads whose folder is missing (the demo ones: seconds)."""
    for args, folder in datasets(recipe):
        if (folder / "meta.json").is_file():
            continue
        log = logs / f"prepare_{folder.name}.log"
        try:
            run_step(console, f"data {shown(folder)}", [sys.executable, "-m", "anchormass.commands.prepare_data",
                                                         *args], log, "prepared")
        except SystemExit:
            raise DataError(f"preparing {shown(folder)} failed; its log: {shown(log)}") from None


def print_summary(console: StageConsole, summary: list[dict]) -> None:
    def fmt(x):
        return f"{x:.4f}" if isinstance(x, float) else "-"

    wm, ws = max(len(r["model"]) for r in summary), max(len(r["stage"]) for r in summary)
    with_seed = "seed" in summary[0]  # a curriculum with seeds: one more column

    def seed(x) -> str:
        return f"{x:>4}  " if with_seed else ""

    console.print(f"\n{seed('seed')}{'model':<{wm}}  {'stage':<{ws}}  {'step':>5}  {'train loss':>10}  {'val loss':>8}")
    for row in summary:
        console.print(f"{seed(row.get('seed'))}{row['model']:<{wm}}  {row['stage']:<{ws}}  "
                      f"{row['global_step'] or 0:>5}  "
                      f"{fmt(row['train_loss']):>10}  {fmt(row['val_loss']):>8}")


def run_curriculum(cfg: DictConfig, task_overrides: list[str], hydra_overrides: list[str]) -> None:
    """cfg: the composed run_curriculum config; the two override lists: Hydra's task and hydra
    overrides of this command line (the train.py ones go to every stage)."""
    t0 = time.perf_counter()
    console = StageConsole(verbose=check_verbose(cfg.verbose))
    if not isinstance(cfg.evaluate, bool):
        raise ConfigError(f"evaluate must be true or false, got {cfg.evaluate!r}")
    recipe = load_recipe(cfg.curriculum, with_evaluate=cfg.evaluate)
    root = resolve_path(cfg.runs_root) / recipe.name
    check_override_path(root, "runs_root/<curriculum>")  # every stage gets its folder as hydra.run.dir=
    runs = stage_runs(recipe, plan(recipe, root.parent, stage_overrides(task_overrides, hydra_overrides)))
    # Stop signals go to the running stages, which save.
    with curriculum_lock(root), forward_stop_signals():
        check_changes(runs, str(cfg.get("changed", "refuse")))
        check_start_files(runs)  # after check_changes: a stage it sets aside starts again, from its file
        try:
            prepare_data(recipe, logs_dir(root), console)
            check_changes(runs, str(cfg.get("changed", "refuse")), data=True)  # the folders the stages read
            summary = execute(runs, parallel=recipe.parallel, console=console)
            reports = evaluate(recipe, runs, root, console) if cfg.evaluate else []
        except TrainingInterrupted as stop:
            exit_interrupted(stop)
        wall = time.perf_counter() - t0
        atomic_write_json(root / "curriculum.json", {"curriculum": recipe.name, "wall_time_s": round(wall, 1),
                                                     **({"seeds": list(recipe.seeds)} if recipe.seeds else {}),
                                                     "stages": summary, "reports": [str(r) for r in reports]},
                          sort_keys=True, indent=2)
    print_summary(console, summary)
    console.print(f"curriculum {recipe.name}: {wall:.0f} s; summary {shown(root / 'curriculum.json')}")
    for r in reports:
        console.print(f"report: {shown(r)}")
