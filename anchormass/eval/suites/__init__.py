"""The evaluation suites, one module (or one package) each (the registry, anchormass/eval/registry.py,
names them).

A suite module imports no other suite module: what several suites share lives beside the
framework in anchormass/eval/ (items.py, scoring.py, report.py).
"""
