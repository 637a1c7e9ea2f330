"""AdamW with weight-decay groups, and a warmup + cosine schedule over the stage's total steps.

The schedule is a pure function of the optimizer step and the stage's configured total, so a
run stopped early (or resumed) follows exactly the curve the full stage would.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from anchormass.errors import ConfigError


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Matrices (projections, embedding, lm_head) decay; vectors (norm gains) do not. Each group is
    named: LearningRateMonitor logs `lr/decay` and `lr/no_decay` rather than `lr-AdamW/pg1`."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay, "name": "decay"}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0, "name": "no_decay"})
    return groups


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based): linear warmup to 1,
    then cosine down to `min_lr_ratio` at `total_steps`, flat after."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def check_optim(lr: float, weight_decay: float, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> None:
    if not lr > 0:
        raise ConfigError(f"optim.lr must be positive, got {lr}")
    if weight_decay < 0:
        raise ConfigError(f"optim.weight_decay must be >= 0, got {weight_decay}")
    if total_steps < 1:
        raise ConfigError(f"stage.total_steps must be >= 1, got {total_steps}")
    if not 0 <= warmup_steps <= total_steps:
        raise ConfigError(f"optim.warmup_steps must be in [0, total_steps={total_steps}], got {warmup_steps}")
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ConfigError(f"optim.min_lr_ratio must be in [0, 1], got {min_lr_ratio}")


def build_optimizer(model: nn.Module, *, lr: float, weight_decay: float, betas=(0.9, 0.95), eps: float = 1e-8,
                    warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.1, fused: bool | None = None):
    """(AdamW, LambdaLR) for Lightning's `configure_optimizers` (scheduler stepped per optimizer step)."""
    check_optim(lr, weight_decay, warmup_steps, total_steps, min_lr_ratio)
    opt = torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=tuple(betas), eps=eps, fused=fused)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: lr_factor(step, warmup_steps, total_steps, min_lr_ratio))
    return opt, sched


def grad_norm(module: nn.Module, strategy: Any = None) -> torch.Tensor:
    """The global L2 norm of the gradients. Sharded (FSDP) gradients are summed over the ranks;
    under DDP each rank already holds the averaged gradients."""
    grads = [p.grad.detach() for p in module.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    if strategy is not None and "fsdp" in type(strategy).__name__.lower():
        norm = strategy.reduce(norm.square(), reduce_op="sum").sqrt()
    return norm
