"""Evaluation library (docs/method.md §6): one module per suite (suites/), a registry by name, one
runner; what the suites share is items.py, scoring.py and report.py (README.md: the map).

    from anchormass.eval.runner import run_evaluation   # evaluate.py, callbacks, curriculum report
    from anchormass.eval.suite import Suite, EvalContext, EvalModel  # the suite interface
    from anchormass.eval.registry import SUITES, make_suite
"""
