"""The LightningModule: one language model, next-token loss (SFT masks via -100 targets), AdamW;
or, for a retrofit stage, layer-local attention transfer from a frozen teacher (training/objectives.py).

Its hyper-parameters are the checkpoint contract (docs/architecture.md): `model_config`,
`trained_lengths`, `tokenizer_path`, the tokenizer's own files (`tokenizer_files`,
training/checkpoint_tokenizer.py), `data_fingerprint`, plus the optimiser and stage settings
that make a resume reproduce the same schedule. The loggers get the run record instead
(runs/run_record.py: the resolved config, the code, the data).

Logged: `train/loss`, `train/target_tokens`, `train/grad_norm` (before clipping), `train/tokens_seen`
(input tokens of every rank since the stage began, carried across resumes in the checkpoint: an x axis
that compares runs of different batch shapes), `val/loss` and `val/ppl` (= exp(val/loss)); the learning
rate per named group comes from LearningRateMonitor (`lr/decay`, `lr/no_decay`). Logging reads values
only: it changes no number of the training.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from anchormass.errors import ConfigError
from anchormass.models.config import ModelConfig
from anchormass.training.checkpoint import load_model
from anchormass.training.loss import chunked_cross_entropy
from anchormass.training.objectives import (
    attention_transfer_loss,
    check_objective,
    check_same_shapes,
    freeze_all_but_attention,
)
from anchormass.training.optim import build_optimizer, grad_norm

# The optimiser settings come from the `optim` node of configs/train.yaml (the one place that sets them).
OPTIM_KEYS = ("lr", "weight_decay", "betas", "eps", "warmup_steps", "min_lr_ratio")


class LitLanguageModel(L.LightningModule):
    def __init__(self, model_config: dict, total_steps: int, seq_len: int, optim: dict,
                 trained_lengths: list[int] | None = None, tokenizer_path: str | None = None,
                 data_fingerprint: Any = None, stage: str = "custom", loss_chunk: int = 1024,
                 tokenizer_checksum: str | None = None, tokenizer_files: dict | None = None,
                 objective: dict | None = None, trainable: str = "all"):
        super().__init__()
        objective = check_objective(objective, trainable)
        if objective["kind"] == "attention_transfer":
            trainable = "attention"  # nothing else is in its loss (training/objectives.py)
            if not objective["teacher"]:
                raise ConfigError("stage.objective attention_transfer needs a teacher checkpoint "
                                  "(objective.teacher=<ckpt>, or start the stage with init_from=<ckpt>)")
        missing = [k for k in OPTIM_KEYS if k not in optim]
        if missing:
            raise ConfigError(f"optim: missing {missing} (configs/train.yaml sets all of {list(OPTIM_KEYS)})")
        cfg = ModelConfig.from_dict(model_config)
        trained = sorted(set(trained_lengths or []) | {int(seq_len)})
        # RoPE's dynamic NTK measures prompts against the longest length trained so far (docs/method.md §1).
        cfg = cfg.replace(original_max_len=max(trained))
        self.save_hyperparameters(dict(
            model_config=cfg.to_dict(), total_steps=int(total_steps), seq_len=int(seq_len),
            optim=dict(optim), trained_lengths=trained,
            tokenizer_path=None if tokenizer_path is None else str(tokenizer_path),
            data_fingerprint=data_fingerprint, stage=stage, loss_chunk=int(loss_chunk),
            tokenizer_checksum=tokenizer_checksum, tokenizer_files=tokenizer_files, objective=objective,
            trainable=trainable), logger=False)
        from anchormass.models import build_model

        self.model = build_model(cfg)
        self.model_cfg = cfg
        if trainable == "attention":
            freeze_all_but_attention(self.model)
        self._teacher = None  # attention_transfer: loaded on the first training step (not a submodule)
        self._warned_empty = False
        self._tokens_seen = 0  # input tokens over all ranks, this stage (restored on resume)
        self._val_sum, self._val_rows = 0.0, 0  # val/loss as Lightning averages it, for val/ppl

    # ------------------------------------------------------------------ loss
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids)

    def compute_loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean CE over non-ignored targets, their count) for {"input_ids", "targets"} [b, T]."""
        hidden = self.model.forward_hidden(batch["input_ids"])  # [b, T, D]; logits only per chunk
        return chunked_cross_entropy(hidden, self.model.lm_head, batch["targets"], self.hparams.loss_chunk)

    def teacher(self) -> torch.nn.Module:
        """The frozen Standard an attention-transfer stage learns from. Kept out of the module's
        children, so it is in no checkpoint, optimizer or DDP/FSDP wrapper; every rank loads its own."""
        if self._teacher is None:
            teacher, _ = load_model(self.hparams.objective["teacher"], map_location="cpu")
            check_same_shapes(teacher.cfg.to_dict(), self.model_cfg.to_dict(),
                              f"attention_transfer teacher {self.hparams.objective['teacher']}")
            teacher.requires_grad_(False)
            param = next(self.model.parameters())
            object.__setattr__(self, "_teacher", teacher.to(device=param.device, dtype=param.dtype))
        return self._teacher

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        if self.hparams.objective["kind"] == "attention_transfer":
            loss, per_layer = attention_transfer_loss(self.model, self.teacher(), batch["input_ids"])
            self.log("train/loss", loss, prog_bar=True, sync_dist=self.trainer.world_size > 1)
            self.log("train/transfer_worst_layer", per_layer.max(), sync_dist=self.trainer.world_size > 1)
            self._tokens_seen += batch["input_ids"].numel() * self.trainer.world_size
            return loss
        loss, n_tokens = self.compute_loss(batch)
        if n_tokens.item() == 0 and not self._warned_empty:
            # Typical cause: SFT examples longer than seq_len, cut before their answers.
            self._warned_empty = True
            rank_zero_warn(f"step {self.global_step}: a training batch has no loss targets (all -100); "
                           f"are the SFT examples longer than seq_len={self.hparams.seq_len}?")
        multi = self.trainer.world_size > 1
        # Every rank reads a micro-batch of the same shape, so the global count needs no communication.
        self._tokens_seen += batch["input_ids"].numel() * self.trainer.world_size
        self.log("train/loss", loss, prog_bar=True, sync_dist=multi)
        self.log("train/target_tokens", n_tokens.float(), reduce_fx="sum", sync_dist=multi)
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        # Called once per optimizer step, after gradient accumulation and before clipping.
        self.log("train/grad_norm", grad_norm(self, self.trainer.strategy), on_step=True, on_epoch=False)
        self.log("train/tokens_seen", float(self._tokens_seen), on_step=True, on_epoch=False)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["tokens_seen"] = int(self._tokens_seen)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._tokens_seen = int(checkpoint.get("tokens_seen", 0))  # older checkpoints: count from here

    def on_validation_epoch_start(self) -> None:
        self._val_sum, self._val_rows = 0.0, 0

    def validation_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, _ = self.compute_loss(batch)
        rows = batch["input_ids"].shape[0]
        self.log("val/loss", loss, prog_bar=True, sync_dist=self.trainer.world_size > 1, batch_size=rows)
        self._val_sum = self._val_sum + loss.detach().double() * rows  # a tensor: no device sync per batch
        self._val_rows += rows
        return loss

    def on_validation_epoch_end(self) -> None:
        if not self._val_rows:
            return
        # The same batch-size-weighted mean over all ranks as `val/loss`, then its exponential.
        totals = torch.stack([torch.as_tensor(self._val_sum, dtype=torch.float64, device=self.device),
                              torch.tensor(float(self._val_rows), dtype=torch.float64, device=self.device)])
        if self.trainer.world_size > 1:
            totals = self.trainer.strategy.reduce(totals, reduce_op="sum")
        mean = float(totals[0] / totals[1])
        self.log("val/ppl", math.inf if mean > 700 else math.exp(mean))  # exp overflows a double past ~709

    # ------------------------------------------------------------------ optimiser
    def configure_optimizers(self):
        o = self.hparams.optim
        opt, sched = build_optimizer(
            self.model, lr=o["lr"], weight_decay=o["weight_decay"], betas=o["betas"], eps=o["eps"],
            warmup_steps=o["warmup_steps"], total_steps=self.hparams.total_steps, min_lr_ratio=o["min_lr_ratio"])
        # "name": LearningRateMonitor's prefix, so the groups log as lr/decay and lr/no_decay.
        return {"optimizer": opt,
                "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1, "name": "lr"}}

