"""The LightningModule: one language model, next-token loss (SFT masks via -100 targets), AdamW.

Its hyper-parameters are the checkpoint contract (docs/architecture.md): `model_config`,
`trained_lengths`, `tokenizer_path`, `data_fingerprint`, plus the optimiser and stage settings
that make a resume reproduce the same schedule.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from anchormass.errors import ConfigError
from anchormass.models.config import ModelConfig
from anchormass.training.loss import chunked_cross_entropy
from anchormass.training.optim import build_optimizer

# The optimiser settings come from the `optim` node of configs/train.yaml (the one place that sets them).
OPTIM_KEYS = ("lr", "weight_decay", "betas", "eps", "warmup_steps", "min_lr_ratio")


class LitLanguageModel(L.LightningModule):
    def __init__(self, model_config: dict, total_steps: int, seq_len: int, optim: dict,
                 trained_lengths: list[int] | None = None, tokenizer_path: str | None = None,
                 data_fingerprint: Any = None, stage: str = "custom", loss_chunk: int = 1024,
                 tokenizer_checksum: str | None = None):
        super().__init__()
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
            tokenizer_checksum=tokenizer_checksum))
        from anchormass.models import build_model

        self.model = build_model(cfg)
        self.model_cfg = cfg
        self._warned_empty = False

    # ------------------------------------------------------------------ loss
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids)

    def compute_loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean CE over non-ignored targets, their count) for {"input_ids", "targets"} [b, T]."""
        hidden = self.model.forward_hidden(batch["input_ids"])  # [b, T, D]; logits only per chunk
        return chunked_cross_entropy(hidden, self.model.lm_head, batch["targets"], self.hparams.loss_chunk)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, n_tokens = self.compute_loss(batch)
        if n_tokens.item() == 0 and not self._warned_empty:
            # Typical cause: SFT examples longer than seq_len, cut before their answers.
            self._warned_empty = True
            rank_zero_warn(f"step {self.global_step}: a training batch has no loss targets (all -100); "
                           f"are the SFT examples longer than seq_len={self.hparams.seq_len}?")
        multi = self.trainer.world_size > 1
        self.log("train/loss", loss, prog_bar=True, sync_dist=multi)
        self.log("train/target_tokens", n_tokens.float(), reduce_fx="sum", sync_dist=multi)
        return loss

    def validation_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, _ = self.compute_loss(batch)
        self.log("val/loss", loss, prog_bar=True, sync_dist=self.trainer.world_size > 1)
        return loss

    # ------------------------------------------------------------------ optimiser
    def configure_optimizers(self):
        o = self.hparams.optim
        opt, sched = build_optimizer(
            self.model, lr=o["lr"], weight_decay=o["weight_decay"], betas=o["betas"], eps=o["eps"],
            warmup_steps=o["warmup_steps"], total_steps=self.hparams.total_steps, min_lr_ratio=o["min_lr_ratio"])
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 1}}
