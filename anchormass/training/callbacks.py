"""Training callbacks: stop on NaN/inf, throughput and MFU, RNG state in checkpoints, final `last`."""

from __future__ import annotations

import os
import random
import time
from collections import deque

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from anchormass.errors import AnchorMassError
from anchormass.training.device_peak import resolve_peak_tflops
from anchormass.training.optim import grad_norm


class TrainingDiverged(AnchorMassError):
    """The loss or the gradient norm became NaN/inf; the run stopped without saving."""


def _last_checkpoint(trainer: L.Trainer) -> str:
    paths = [getattr(cb, "last_model_path", "") for cb in trainer.checkpoint_callbacks]
    paths = [p for p in paths if p]
    return paths[0] if paths else "none written yet"


class NonFiniteStop(Callback):
    """Raise before a NaN/inf loss is backpropagated or a NaN/inf gradient is applied.

    Raising (rather than `trainer.should_stop`) means no checkpoint callback runs afterwards,
    so the newest checkpoint on disk is the last one made from finite weights.
    """

    def _check(self, trainer: L.Trainer, value: torch.Tensor, what: str) -> None:
        bad = (~torch.isfinite(value.detach().float())).any().float()
        # Every rank must agree, or one rank raises while the others wait in a collective.
        if trainer.world_size > 1:
            bad = trainer.strategy.reduce(bad, reduce_op="sum")
        if bad.item() > 0:
            raise TrainingDiverged(
                f"{what} became {value.detach().float().item()} at step {trainer.global_step}; "
                f"training stopped, last good checkpoint: {_last_checkpoint(trainer)}")

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._check(trainer, loss, "training loss")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._check(trainer, grad_norm(pl_module), "gradient norm")


class Throughput(Callback):
    """Logs tokens/s (all devices) and MFU, averaged over the last `window` optimizer steps.

    MFU = model FLOPs per token x tokens/s / (peak_tflops x 1e12 x devices); `peak_tflops: auto`
    looks the device up (training/device_peak.py); not logged when the peak is null or unknown
    (e.g. on CPU, where no peak is meaningful).
    """

    def __init__(self, peak_tflops: float | str | None = None, window: int = 20):
        self.setting = peak_tflops
        self.peak_tflops: float | None = None
        self.window = window
        self._times: deque[float] = deque(maxlen=window + 1)
        self._tokens: deque[int] = deque(maxlen=window)
        self._pending = 0
        self._flops_per_token: float | None = None

    def _flops(self, pl_module, seq_len: int) -> float:
        if self._flops_per_token is None:
            try:
                from anchormass.models.accounting import estimate_flops_per_token

                self._flops_per_token = float(estimate_flops_per_token(pl_module.model_cfg, seq_len))
            except (ImportError, AttributeError, TypeError):
                # 6N: forward + backward matmul FLOPs per token, attention excluded.
                self._flops_per_token = 6.0 * sum(p.numel() for p in pl_module.parameters())
        return self._flops_per_token

    def on_train_start(self, trainer, pl_module) -> None:
        self.peak_tflops = resolve_peak_tflops(self.setting, trainer)
        self._times.clear()
        self._tokens.clear()
        self._times.append(time.perf_counter())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._pending += batch["input_ids"].numel() * trainer.world_size
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return  # the optimizer step is not complete yet
        self._times.append(time.perf_counter())
        self._tokens.append(self._pending)
        self._pending = 0
        if len(self._times) < 2:
            return
        elapsed = self._times[-1] - self._times[0]
        tokens = sum(list(self._tokens)[-(len(self._times) - 1):])
        tps = tokens / max(elapsed, 1e-9)
        metrics = {"perf/tokens_per_s": tps}
        if self.peak_tflops:
            flops = self._flops(pl_module, batch["input_ids"].shape[1])
            metrics["perf/mfu"] = flops * tps / (self.peak_tflops * 1e12 * trainer.world_size)
        pl_module.log_dict(metrics, prog_bar=False, rank_zero_only=True)


class RngState(Callback):
    """Python / numpy / torch (CPU and CUDA) RNG states travel in the checkpoint, so a resumed
    run draws the same random numbers as an uninterrupted one."""

    def state_dict(self) -> dict:
        # Plain types and tensors only, so Lightning's weights_only checkpoint loading accepts it.
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        state = {"python": random.getstate(), "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss,
                                                        gauss), "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict) -> None:
        random.setstate(state["python"])
        kind, keys, pos, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["cuda"])


class SaveLastOnEnd(Callback):
    """ModelCheckpoint refreshes `last.ckpt` only when a periodic save is due; when a stage's
    total steps is not a multiple of the interval, this writes `last.ckpt` at the final step."""

    def on_train_end(self, trainer, pl_module) -> None:
        for cb in trainer.checkpoint_callbacks:
            if not getattr(cb, "save_last", False) or cb.dirpath is None:
                continue
            if getattr(cb, "_last_global_step_saved", None) == trainer.global_step and cb.last_model_path:
                continue  # already written at this very step
            path = os.path.join(cb.dirpath, cb.CHECKPOINT_NAME_LAST + cb.FILE_EXTENSION)
            # the full training state; said explicitly, or Lightning logs "`weights_only` was not set,
            # defaulting to `False`" into train.log, which reads like an unsafe load (it is a save)
            trainer.save_checkpoint(path, weights_only=False)
            cb.last_model_path = path
            # Lightning's own end-of-training save checks these (private) fields; without them it
            # would write the same last.ckpt a second time.
            cb._last_global_step_saved = trainer.global_step
            cb._last_checkpoint_saved = path


class ProgressLine(Callback):
    """One plain line every `every_n_steps` optimizer steps (`<model>/<stage> step k/N loss x`):
    readable in logs and when several runs share a terminal, where tqdm bars would garble."""

    def __init__(self, every_n_steps: int = 20):
        self.every = max(1, int(every_n_steps))
        self._t0 = time.perf_counter()

    def on_train_start(self, trainer, pl_module) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if not trainer.is_global_zero or (batch_idx + 1) % trainer.accumulate_grad_batches:
            return
        if step % self.every and step != trainer.max_steps:
            return
        loss = trainer.callback_metrics.get("train/loss")
        hp = pl_module.hparams
        print(f"{hp.model_config['name']}/{hp.stage}: step {step}/{trainer.max_steps}"
              + (f" loss {float(loss):.4f}" if loss is not None else "")
              + f" ({time.perf_counter() - self._t0:.0f} s)", flush=True)
