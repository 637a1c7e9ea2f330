"""Evaluate one model, or compare two on identical items (`python evaluate.py` or `anchormass-eval`; docs/method.md §6).

    python evaluate.py suite=ppl ckpt=runs/a.ckpt compare_ckpt=runs/b.ckpt eval=demo
    python evaluate.py suite=profile model=anchormass_tiny compare_model=standard_tiny

Writes results.json, report.md and PNG plots into out_dir; bad input exits 2 with one line.
"""

import sys

import hydra
from omegaconf import DictConfig

from anchormass.cli import exit_on_error
from anchormass.commands.arguments import check_arguments
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
    from anchormass.cli_help import presets
    from anchormass.eval.registry import SUITES

    check_arguments("evaluate.py", __doc__, "evaluate", ["eval", "model"],
                    {"suite": [*SUITES, "all"], "compare_model": presets("model")}, follow_runner=True)
    main()


if __name__ == "__main__":
    cli()
