"""Helpers shared by the suites: OOM as a result, progress bars, log-likelihood of targets."""

from __future__ import annotations

import gc
from typing import Iterable

import torch
import torch.nn.functional as F

OOM = "OOM"


def is_oom(err: BaseException) -> bool:
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(err, (RuntimeError, MemoryError)) and (
        isinstance(err, MemoryError) or "out of memory" in str(err).lower()
        or "can't allocate memory" in str(err).lower())


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def progress(iterable: Iterable, enabled: bool, desc: str, total: int | None = None):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, leave=False, dynamic_ncols=True)


def target_logprobs(model, ids: torch.Tensor, start: int) -> torch.Tensor:
    """log p(ids[:, t+1] | ids[:, :t+1]) for t = start .. T-2: [B, T-1-start] (fp32).

    Only the scored positions go through the LM head, so long contexts do not materialise
    [B, T, vocab] logits.
    """
    if hasattr(model, "forward_hidden") and hasattr(model, "lm_head"):
        hidden = model.forward_hidden(ids)[:, start:-1]  # [B, n, d]
        logits = model.lm_head(hidden)
    else:
        logits = model(ids)[:, start:-1]  # [B, n, V]
    return gather_logprobs(logits, ids[:, start + 1:])


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [B, n, V], targets [B, n] -> log p(target) [B, n] in fp32."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, targets[..., None]).squeeze(-1)


def fmt_p(p: float) -> str:
    return f"{p:.4f}" if p >= 1e-3 else f"{p:.2e}"
