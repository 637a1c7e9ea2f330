"""Validate at the last optimizer step, whatever `stage.val_every` is.

A run's result (and an Optuna trial's objective, train.py's return value) is its last validation
loss; with 45 steps and val_every=20 Lightning would last validate at step 40, and a 5-step
trial with val_every=10 never. Asking Lightning to stop at the last step is its own way to get a
validation there (`Trainer.should_stop` lets the epoch loop validate before it ends); when the last
step is a regular validation step, that one validation is all that runs.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback


class ValidateAtEnd(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True
