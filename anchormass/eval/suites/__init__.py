"""The evaluation suites, one module each (the registry, anchormass/eval/registry.py, names them).

A suite module imports no other suite module: what several suites share lives beside the
framework in anchormass/eval/ (methods.py, passkey_trials.py, ppl_items.py, predictions.py).
"""
