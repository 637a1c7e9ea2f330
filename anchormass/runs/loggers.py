"""Loggers that continue one history across resumes (configs/logger/*.yaml).

A run resumed from a checkpoint at optimizer step g re-logs everything from Lightning's logging
step g on (the rows of steps 1..g sit at logging steps 0..g-1, the resumed run's first row is at
g). Whatever the interrupted run logged at steps >= g came after that checkpoint and is logged
again, so each logger drops it:

- CSV: rows at steps >= g are removed from `metrics.csv` (Lightning's CSVLogger would delete the
  whole file), the rest is kept and appended to; rows reach the file at every log call, so a
  killed run has lost nothing it logged before its checkpoint.
- TensorBoard: the new event file starts with `purge_step=g`, so readers hide the older events
  at steps >= g; events are flushed at every log call.
- wandb: logged with an explicit `step` (the trainer's), so a resumed segment continues the step
  axis of the run it resumes (run.py keeps the run id) instead of restarting `_step` at 0. Offline,
  each segment is its own folder, and nothing can drop what an interrupted segment logged after its
  checkpoint: the resumed segment logs those steps again.

Not covered: Lightning saves a step's checkpoint before that step's validation and a resume does
not repeat it, so a run killed during that validation has no validation row for that step.

run.py passes `resume_step` (the checkpoint's global step) when it resumes; null otherwise.
"""

from __future__ import annotations

import csv
import io
import json
import os
from typing import Any, Mapping

import torch
from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.fabric.utilities.logger import _add_prefix, _convert_params, _flatten_dict
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, open_dict

from anchormass.utils import atomic_write_text


def _logged_before(row: dict, step: int) -> bool:
    """A whole metrics.csv row (every column read, none extra) logged at a step before `step`."""
    if None in row or None in row.values():
        return False
    try:
        return int(float(row["step"])) < step
    except (KeyError, ValueError):
        return False


class ContinuingExperimentWriter(ExperimentWriter):
    """Lightning's CSV writer, keeping an existing metrics.csv up to (not including) `resume_step`."""

    def __init__(self, log_dir: str, resume_step: int | None) -> None:
        self._resume_step = resume_step
        super().__init__(log_dir=log_dir)

    def _check_log_dir_exists(self) -> None:
        if self._resume_step is None or not os.path.isfile(self.metrics_file_path):
            return super()._check_log_dir_exists()  # a fresh run: Lightning's behaviour
        with open(self.metrics_file_path, newline="", encoding="utf-8") as fh:
            text = fh.read()
        # A run killed mid-append leaves a partial last line: only whole lines count.
        reader = csv.DictReader(io.StringIO(text[:text.rfind("\n") + 1], newline=""))
        header = list(reader.fieldnames or [])
        rows = [row for row in reader if _logged_before(row, self._resume_step)]
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_text(self.metrics_file_path, text.getvalue())
        # The header the appended rows must follow (Lightning rewrites the file when keys are added).
        self.metrics_keys = sorted(header)


class ContinuingCSVLogger(CSVLogger):
    def __init__(self, *args: Any, resume_step: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._resume_step = resume_step

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = ContinuingExperimentWriter(self.log_dir, self._resume_step)
        return self._experiment


class ContinuingTensorBoardLogger(TensorBoardLogger):
    # The metrics the HPARAMS tab shows beside each run's hyper-parameters (read from the scalars).
    HPARAM_METRICS = ("val/loss", "val/ppl", "train/loss")

    def __init__(self, *args: Any, resume_step: int | None = None, **kwargs: Any) -> None:
        if resume_step is not None:
            kwargs["purge_step"] = int(resume_step)
        super().__init__(*args, **kwargs)

    @rank_zero_only
    def log_hyperparams(self, params: Any, metrics: Any = None, step: int | None = None) -> None:
        """Lightning writes the HPARAMS summary only with metric values (`default_hp_metric`
        logs a fake `hp_metric`); this writes it with the metrics' names alone, so the tab lists
        the run's real curves and no value is logged at step 0."""
        super().log_hyperparams(params, metrics, step)  # hparams.yaml
        if metrics is not None:
            return  # Lightning wrote the summary with those values
        from torch.utils.tensorboard.summary import hparams

        plain = self._sanitize_params(_flatten_dict(_convert_params(params)))
        writer = self.experiment._get_file_writer()
        for summary in hparams(plain, dict.fromkeys(self.HPARAM_METRICS, 0.0)):
            writer.add_summary(summary, step)
        self.experiment.flush()

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        super().log_metrics(metrics, step)
        self.experiment.flush()  # a killed run keeps what it logged


class ContinuingWandbLogger(WandbLogger):
    def __init__(self, *args: Any, resume_step: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._resume_step = resume_step
        # Lightning always passes `anonymous` (None unless set), and wandb warns that the setting is
        # gone on every run: an unset value is dropped so the console stays quiet.
        if self._wandb_init.get("anonymous") is None:
            self._wandb_init.pop("anonymous", None)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if step is None:
            return super().log_metrics(metrics, step)
        metrics = _add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR)
        self.experiment.log({**metrics, "trainer/global_step": step}, step=int(step))


def attach_resume_step(cfg: DictConfig, step: int | None) -> None:
    """Tell a continuing logger (one whose config declares `resume_step`) where the resumed run starts."""
    logger = cfg.get("logger")
    if isinstance(logger, DictConfig) and "resume_step" in logger:
        with open_dict(logger):
            logger.resume_step = step


class CarriedMetrics(Callback):
    """The last value of each logged metric travels in the checkpoint, so a resumed run reports
    what an uninterrupted one would. A resume that trains no further step (its checkpoint is at
    the stage's end) reports what the finished run reported: its `train_result.json` metrics when
    that file is from the same step (a checkpoint is written before that step's validation),
    otherwise the metrics its checkpoint carried."""

    def __init__(self, result_file: str | os.PathLike | None = None) -> None:
        self.result_file = result_file
        self.carried: dict[str, float] = {}
        self._fit_trainer = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        self._fit_trainer = trainer

    def state_dict(self) -> dict:
        now = {}
        if self._fit_trainer is not None:
            now = {k: float(v) for k, v in self._fit_trainer.callback_metrics.items() if v.numel() == 1}
        return {"metrics": {**self.carried, **now}}

    def load_state_dict(self, state: dict) -> None:
        self.carried = {str(k): float(v) for k, v in (state.get("metrics") or {}).items()}

    def _reported_at(self, step: int) -> dict[str, float]:
        try:
            with open(self.result_file, encoding="utf-8") as fh:
                result = json.load(fh)
        except (TypeError, OSError, ValueError):  # none yet, or unreadable: the checkpoint's values
            return {}
        return dict(result.get("metrics") or {}) if result.get("global_step") == step else {}

    def on_fit_end(self, trainer, pl_module) -> None:
        # What this run logged itself wins; the rest is what the run it resumed had.
        for key, value in {**self.carried, **self._reported_at(trainer.global_step)}.items():
            trainer.callback_metrics.setdefault(key, torch.tensor(float(value)))
