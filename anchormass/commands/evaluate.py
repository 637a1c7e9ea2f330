"""Evaluate one model, or compare two on identical items (`python evaluate.py` or `anchormass-eval`; docs/method.md §6).

    python evaluate.py suite=ppl ckpt=runs/a.ckpt compare_ckpt=runs/b.ckpt eval=demo
    python evaluate.py suite=profile model=anchormass_tiny compare_model=standard_tiny

Writes results.json, report.md and PNG plots into out_dir; bad input exits 2 with one line.
"""

import sys

import hydra
from omegaconf import DictConfig

from anchormass.cli import check_group_choices, check_overrides, exit_on_error, quoted_where_needed
from anchormass.utils import CONFIG_ROOT


@exit_on_error
def evaluate(cfg: DictConfig) -> None:
    from anchormass.eval.runner import run_evaluation

    out = run_evaluation(cfg)
    print(f"results: {out / 'results.json'}\nreport:  {out / 'report.md'}")
    check_scores_finite(out / "results.json")


def check_scores_finite(results_path) -> None:
    """Scores that are not finite numbers are said out loud: a warning for one model; for a
    comparison, whose result they void, an error line and exit 1 (the files stay, to look at)."""
    import json

    from anchormass.eval.report import non_finite_scores

    results = json.loads(results_path.read_text(encoding="utf-8"))
    bad = non_finite_scores(results)
    if not bad:
        return
    if len(results.get("models") or []) > 1:
        print(f"error: the comparison has scores that are not finite numbers ({'; '.join(bad)}); its "
              f"differences and tests mean nothing: {results_path}", file=sys.stderr)
        sys.exit(1)
    print(f"warning: scores that are not finite numbers ({'; '.join(bad)}): {results_path}", file=sys.stderr)


@hydra.main(version_base="1.3", config_path=str(CONFIG_ROOT), config_name="evaluate")
def main(cfg: DictConfig) -> None:
    evaluate(cfg)


def cli() -> None:
    """`python evaluate.py ...` and `anchormass-eval ...`."""
    from anchormass.cli_help import exit_with_help, presets
    from anchormass.eval.registry import SUITES
    from anchormass.runs.logged_process import follow_parent

    exit_with_help(sys.argv[1:], "evaluate.py", __doc__, ["eval", "model"], "evaluate",
                   {"suite": [*SUITES, "all"], "compare_model": presets("model")})

    follow_parent()  # a curriculum's stage ends with its runner
    sys.argv[1:] = quoted_where_needed(sys.argv[1:])  # a non-ASCII path is a path
    check_group_choices(CONFIG_ROOT, sys.argv[1:])
    check_overrides(CONFIG_ROOT, "evaluate", sys.argv[1:])
    main()


if __name__ == "__main__":
    cli()
