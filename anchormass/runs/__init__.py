"""The run machinery around training (anchormass/training/ says how a model learns): one run folder's
layout, launching train.py, resuming, stopping on signals, Slurm requeues, Optuna sweeps, the stage
console and the records a run leaves."""
