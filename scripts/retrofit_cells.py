#!/usr/bin/env python
"""The finished cells of a curriculum as kv_frontier overrides, one per line (scripts/smollm2_retrofit.sh):

    python scripts/retrofit_cells.py curriculum=retrofit_smollm2 [runs_root=runs]
    +eval.kv_frontier.trained.e2e_g8=/abs/runs/retrofit_smollm2/seed0/e2e_g8/retro_1k/checkpoints/last.ckpt

A model is listed once its last stage has trained all its steps (anchormass/curriculum/cells.py).
"""

from __future__ import annotations

import sys

from anchormass.cli import exit_on_error
from anchormass.errors import ConfigError


@exit_on_error
def main(argv: list[str]) -> None:
    opts = dict(arg.partition("=")[::2] for arg in argv)
    if not opts.get("curriculum") or set(opts) - {"curriculum", "runs_root"}:
        raise ConfigError(f"usage: retrofit_cells.py curriculum=<name> [runs_root=<dir>], got {argv}")
    from hydra import compose

    from anchormass.curriculum.cells import finished_cells
    from anchormass.curriculum.recipe import load_recipe
    from anchormass.curriculum.stage_identity import configs_here
    from anchormass.utils import resolve_path

    with configs_here():
        cfg = compose("run_curriculum", overrides=[f"curriculum={opts['curriculum']}"])
    recipe = load_recipe(cfg.curriculum, with_evaluate=False)
    for label, path in finished_cells(recipe, resolve_path(opts.get("runs_root") or cfg.runs_root)).items():
        print(f"+eval.kv_frontier.trained.{label}={path}")


if __name__ == "__main__":
    main(sys.argv[1:])
