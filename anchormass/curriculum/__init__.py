"""The multi-stage curriculum (docs/method.md §5): recipe -> plan -> runs -> closing report.

- `recipe.py`: a curriculum file (configs/curriculum/<name>.yaml) as a typed, checked spec; recipes
  compose (`defaults: [mini, _self_]`, stages and evaluations keyed by name).
- `plan.py`: every (seed, model, stage) run as a structured record, its checks (init_from chains,
  shared stages), and `train_args`, the one place a record becomes a train.py command line.
- `execute.py`: the train.py processes, chains side by side, skip / resume, stop signals.
- `closing.py`: the closing comparisons through evaluate.py and the joined report.
- `runner.py`: the whole command (scripts/run_curriculum.py is its entry point).
"""
