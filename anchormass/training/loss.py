"""Next-token cross-entropy computed in sequence chunks from the final hidden states.

At 32K tokens x 28K vocab the full logits would be 3.6 GB per sequence in fp32 (twice that
with their gradient); here only one chunk's logits exist at a time, forward and backward
(each chunk is recomputed in backward via activation checkpointing).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # hidden [b, t, D], weight [V, D], targets [b, t] -> summed CE over the non-ignored targets
    logits = F.linear(hidden, weight).float()  # [b, t, V], fp32 for a stable log-softmax
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_cross_entropy(hidden: torch.Tensor, lm_head: torch.nn.Linear, targets: torch.Tensor,
                          chunk_len: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss over non-ignored targets, count of those targets).

    hidden: [B, T, D] final-normed hidden states; targets: [B, T] (-100 = no loss).
    A batch with no target at all gives loss 0 (with a graph), not NaN.
    """
    n_tokens = (targets != IGNORE_INDEX).sum()
    total = hidden.new_zeros((), dtype=torch.float32)
    T = hidden.shape[1]
    for start in range(0, T, chunk_len):
        h = hidden[:, start:start + chunk_len]
        y = targets[:, start:start + chunk_len]
        if torch.is_grad_enabled() and T > chunk_len:
            total = total + checkpoint(_chunk_loss_sum, h, lm_head.weight, y, use_reentrant=False)
        else:
            total = total + _chunk_loss_sum(h, lm_head.weight, y)
    return total / n_tokens.clamp(min=1), n_tokens
