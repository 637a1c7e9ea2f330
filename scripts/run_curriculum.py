"""Run a whole training curriculum for both models, then the comparison report.

    python scripts/run_curriculum.py                      # the miniature (configs/curriculum/mini.yaml)
    python scripts/run_curriculum.py curriculum=full_158m trainer=ddp trainer.devices=8

Options (configs/run_curriculum.yaml): curriculum=<name>, runs_root=<dir>, evaluate=false,
verbose=0|1|2, curriculum.models=[a,b], curriculum.parallel=<n>, curriculum.seeds=[0,1,2]. Every
other override is a train.py override and goes to each stage. Rerunning the same command resumes.
Ctrl-C / SIGTERM / SIGUSR1: the running stages save at their next optimizer step, nothing else
starts, exit 75 (resumable). A second runner of the same curriculum is refused (exit 2).
With seeds, each comparison runs once per seed and is then aggregated over the seeds.
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
from anchormass.eval.aggregate import write_aggregate
from anchormass.training.curriculum import (
    StageRun,
    check_curriculum,
    curriculum_lock,
    datasets,
    evaluate_pairs,
    execute,
    plan,
    report_jobs,
    seeds,
    stage_overrides,
)
from anchormass.training.logged_process import run_logged, stop_requested
from anchormass.training.preemption import TrainingInterrupted, exit_interrupted, forward_stop_signals, signal_name
from anchormass.training.stage_console import StageConsole, Task, shown
from anchormass.utils import CONFIG_ROOT, REPO_ROOT, atomic_write_json, atomic_write_text, resolve_path

def run_step(console: StageConsole, label: str, cmd: list[str], log: Path, finished: str) -> None:
    """A data preparation or report process: its output to `log`, one line when it is done."""
    task = Task(label, log)
    t0 = time.perf_counter()
    rc = run_logged(cmd, log, echo=(lambda line: console.print(f"[{label}] {line}")) if console.verbose >= 2 else None)
    if rc != 0 and stop_requested():  # it got the stop signal too: not a failure of its own
        raise TrainingInterrupted(f"{signal_name(stop_requested())} during {label}; rerun the same command to resume")
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
    """The closing comparisons via evaluate.py: each entry's pair (default models[0] vs models[1])
    at its stage, once per seed; with seeds, each entry's reports are then aggregated."""
    reports: list[Path] = []
    per_entry: dict[str, list] = {}
    for job in report_jobs(cur, runs, root):
        tag = f"{job.name}" + (f" seed{job.seed}" if job.seed is not None else "")
        cmd = [sys.executable, str(REPO_ROOT / "evaluate.py"), f"ckpt={job.a.last_ckpt}",
               f"compare_ckpt={job.b.last_ckpt}", f"out_dir={job.out_dir}", "overwrite=true", *job.overrides]
        if console.verbose >= 1:
            console.print(f"report {tag}: {job.a.model} vs {job.b.model} at {job.a.stage} ...")
        log = root / "logs" / (f"report_{job.name}" + (f"_seed{job.seed}" if job.seed is not None else "") + ".log")
        run_step(console, f"report {tag}", cmd, log, "written")
        reports.append(job.out_dir / "report.md")
        per_entry.setdefault(job.name, []).append(job)
    seed_list = seeds(cur)
    if seed_list is not None:
        for name, jobs in per_entry.items():
            first = jobs[0]
            note = f"{first.a.model} (ckpt, A) vs {first.b.model} (compare_ckpt, B) at stage {first.a.stage}"
            out = write_aggregate([j.out_dir / "results.json" for j in jobs], [j.seed for j in jobs],
                                  root / "report" / name, note)
            reports.append(out / "report.md")
    if per_entry:
        reports.append(write_closing_report(cur, per_entry, root))
    return reports


def write_closing_report(cur: DictConfig, per_entry: dict[str, list], root: Path) -> Path:
    """report/report.md: the curriculum's `report_note`, then every entry's sections under a heading
    that names the stage whose checkpoints it scored (entries may score different stages: the
    perplexity of a language-modelling stage, recall after the long-context ones)."""
    lines = [f"# {cur.name}: closing report", ""]
    if cur.get("report_note"):
        lines += [str(cur.report_note).strip(), ""]
    for name, jobs in per_entry.items():
        first = jobs[0]
        src = root / "report" / name / "report.md"  # with seeds: the aggregate over them
        text = src.read_text(encoding="utf-8")
        body = text[text.find("\n## ") + 1:] if "\n## " in text else ""  # its suites' sections
        lines += [f"## {name}: {first.a.model} vs {first.b.model}, checkpoints of stage {first.a.stage}", "",
                  f"Full report with provenance: {shown(src)}", ""]
        lines += [f"#{line}" if line.startswith("#") else line for line in body.rstrip().splitlines()] + [""]
    out = root / "report" / "report.md"
    atomic_write_text(out, "\n".join(lines))
    return out


def print_summary(console: StageConsole, summary: list[dict]) -> None:
    def fmt(x):
        return f"{x:.4f}" if isinstance(x, float) else "-"

    wm, ws = max(len(r["model"]) for r in summary), max(len(r["stage"]) for r in summary)
    with_seed = "seed" in summary[0]  # a curriculum with seeds: one more column

    def seed(x) -> str:
        return f"{x:>4}  " if with_seed else ""

    console.print(f"\n{seed('seed')}{'model':<{wm}}  {'stage':<{ws}}  {'step':>5}  {'train loss':>10}  {'val loss':>8}")
    for row in summary:
        console.print(f"{seed(row.get('seed'))}{row['model']:<{wm}}  {row['stage']:<{ws}}  {row['global_step'] or 0:>5}  "
                      f"{fmt(row['train_loss']):>10}  {fmt(row['val_loss']):>8}")


@hydra.main(version_base="1.3", config_path=str(CONFIG_ROOT), config_name="run_curriculum")
@exit_on_error
def main(cfg: DictConfig) -> None:
    t0 = time.perf_counter()
    console = StageConsole(verbose=check_verbose(cfg.verbose))
    cur = check_curriculum(cfg.curriculum)
    if not isinstance(cfg.evaluate, bool):
        raise ConfigError(f"evaluate must be true or false, got {cfg.evaluate!r}")
    if cfg.evaluate:
        evaluate_pairs(cur)  # refuse a comparison that cannot run now, not after the training
    root = resolve_path(cfg.runs_root) / str(cur.name)
    # Before anything is written: a second launch of this curriculum is refused here, not after it has
    # rerun or rewritten the first one's stages. Stop signals go to the running stages, which save.
    with curriculum_lock(root), forward_stop_signals():
        try:
            run(cfg, cur, root, console, t0)
        except TrainingInterrupted as stop:
            exit_interrupted(stop)


def run(cfg: DictConfig, cur: DictConfig, root: Path, console: StageConsole, t0: float) -> None:
    overrides = HydraConfig.get().overrides
    runs = plan(cur, root.parent, stage_overrides(list(overrides.task), list(overrides.hydra)))
    prepare_data(cur, root / "logs", console)
    summary = execute(runs, parallel=int(cur.get("parallel", 1)), console=console)
    reports = evaluate(cur, runs, root, console) if cfg.evaluate else []
    wall = time.perf_counter() - t0
    atomic_write_json(root / "curriculum.json", {"curriculum": str(cur.name), "wall_time_s": round(wall, 1),
                                                 **({"seeds": seeds(cur)} if seeds(cur) is not None else {}),
                                                 "stages": summary, "reports": [str(r) for r in reports]},
                      sort_keys=True, indent=2)
    print_summary(console, summary)
    console.print(f"curriculum {cur.name}: {wall:.0f} s; summary {shown(root / 'curriculum.json')}")
    for r in reports:
        console.print(f"report: {shown(r)}")


if __name__ == "__main__":
    check_group_choices(CONFIG_ROOT, sys.argv[1:])
    main()
