"""The closing comparisons: each evaluate entry through evaluate.py, seed by seed, then one report.

An entry compares model A (ckpt=) with model B (compare_ckpt=) on their last checkpoints of one
stage. Reports go to `runs/<curriculum>/report/<entry>/` (with seeds: `.../<entry>/seed<s>/`, then
the aggregate over the seeds in `.../<entry>/`, anchormass/eval/aggregate.py). `report/report.md`
joins the entries, each under a heading that names the stage whose checkpoints it scored (entries
may score different stages: the perplexity of a language-modelling stage, recall after the
long-context ones), after the recipe's `report_note`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from anchormass.curriculum.execute import StageRun, run_step
from anchormass.curriculum.recipe import Recipe
from anchormass.eval.aggregate import write_aggregate
from anchormass.runs.layout import logs_dir
from anchormass.runs.stage_console import StageConsole, shown
from anchormass.utils import atomic_write_text


@dataclass
class ReportJob:
    """One closing comparison: model `a` vs model `b` at a stage, under one training seed."""
    name: str  # the evaluate entry's name
    seed: int | None
    a: StageRun  # the two runs compared: A (ckpt=) and B (compare_ckpt=)
    b: StageRun
    out_dir: Path
    overrides: list[str]


def side(label: str, stage: str) -> tuple[str, str]:
    """(model, stage) of one side of a comparison: `<model>/<stage>`, or a model at the entry's stage."""
    model, _, own = label.partition("/")
    return model, own or stage


def report_jobs(recipe: Recipe, runs: list[StageRun], root: Path) -> list[ReportJob]:
    """Every evaluate.py call, entry by entry and seed by seed. The recipe's `eval_overrides` follow
    every entry's own (e.g. smaller evaluation sizes for a quick run). A model that does not train
    the entry's stage under a seed has no comparison there."""
    by_key = {(r.seed, r.model, r.stage): r for r in runs}
    jobs = []
    for entry in recipe.evaluate:
        for seed in recipe.seed_list:
            out = root / "report" / entry.name / (f"seed{seed}" if seed is not None else "")
            a, b = (by_key.get((seed, *side(label, entry.stage))) for label in (entry.a, entry.b))
            if a is None or b is None:
                continue
            jobs.append(ReportJob(entry.name, seed, a, b, out, [*entry.overrides, *recipe.eval_overrides]))
    return jobs


def evaluate(recipe: Recipe, runs: list[StageRun], root: Path, console: StageConsole) -> list[Path]:
    """Run every comparison; with seeds, aggregate each entry over them; then the joined report."""
    reports: list[Path] = []
    per_entry: dict[str, list[ReportJob]] = {}
    for job in report_jobs(recipe, runs, root):
        tag = f"{job.name}" + (f" seed{job.seed}" if job.seed is not None else "")
        cmd = [sys.executable, "-m", "anchormass.commands.evaluate", f"ckpt={job.a.last_ckpt}",
               f"compare_ckpt={job.b.last_ckpt}", f"out_dir={job.out_dir}", "overwrite=true", *job.overrides]
        if console.verbose >= 1:
            console.print(f"report {tag}: {job.a.model} vs {job.b.model} at {job.a.stage} ...")
        log = logs_dir(root) / (f"report_{job.name}" + (f"_seed{job.seed}" if job.seed is not None else "") + ".log")
        run_step(console, f"report {tag}", cmd, log, "written")
        reports.append(job.out_dir / "report.md")
        per_entry.setdefault(job.name, []).append(job)
    if recipe.seeds is not None:
        for name, jobs in per_entry.items():
            first = jobs[0]
            note = f"{first.a.model} (ckpt, A) vs {first.b.model} (compare_ckpt, B) at stage {first.a.stage}"
            out = write_aggregate([j.out_dir / "results.json" for j in jobs], [j.seed for j in jobs],
                                  root / "report" / name, note)
            reports.append(out / "report.md")
    if per_entry:
        reports.append(write_closing_report(recipe, per_entry, root))
    return reports


def write_closing_report(recipe: Recipe, per_entry: dict[str, list[ReportJob]], root: Path) -> Path:
    lines = [f"# {recipe.name}: closing report", ""]
    if recipe.report_note:
        lines += [recipe.report_note.strip(), ""]
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
