"""A curriculum's finished cells: each model's last stage, once it has trained all its steps.

What scores a study's models after training (the kv_frontier suite's `trained:` cells, docs/method.md
§6 l) asks the plan where each model's last checkpoint is, rather than spelling run folders itself.
"""

from __future__ import annotations

from pathlib import Path

from anchormass.curriculum.plan import plan
from anchormass.curriculum.recipe import Recipe
from anchormass.runs.layout import finished_run, last_checkpoint


def finished_cells(recipe: Recipe, runs_root: Path) -> dict[str, Path]:
    """{label: last checkpoint} of every model (per seed) whose last stage finished; the label is
    the model's name, with `_seed<n>` when the recipe trains more than one seed."""
    last = {}
    for run in plan(recipe, runs_root):  # a model's stages come in their order
        last[(run.seed, run.model)] = run
    many = len({seed for seed, _ in last}) > 1
    return {f"{model}_seed{seed}" if many else model: last_checkpoint(run.out_dir)
            for (seed, model), run in last.items() if finished_run(run.out_dir)}
