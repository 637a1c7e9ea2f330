"""Helpers shared by the suites: OOM as a result, progress bars, log-likelihood of targets."""

from __future__ import annotations

import gc
import inspect
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


def padded_logits(model, ids: torch.Tensor, lengths: list[int], rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Logits [n, V] at positions (rows[i], cols[i]) of the right-padded batch ids [B, T] whose
    row b holds lengths[b] real tokens; only those positions go through the LM head.

    Our models get `lengths`, so each row is scored as it would be alone (its own RoPE base,
    docs/method.md §1) whatever else shares the batch. A model whose forward takes no `lengths`
    (a test double) gets the padded batch as it is."""
    if hasattr(model, "forward_hidden") and hasattr(model, "lm_head"):
        extra = {"lengths": lengths} if _takes_lengths(model.forward_hidden) else {}
        return model.lm_head(model.forward_hidden(ids, **extra)[rows, cols])
    extra = {"lengths": lengths} if _takes_lengths(model.forward) else {}
    return model(ids, **extra)[rows, cols]


def _takes_lengths(fn) -> bool:
    try:
        return "lengths" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [B, n, V], targets [B, n] -> log p(target) [B, n] in fp32."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, targets[..., None]).squeeze(-1)


def fmt_p(p: float) -> str:
    return f"{p:.4f}" if p >= 1e-3 else f"{p:.2e}"
