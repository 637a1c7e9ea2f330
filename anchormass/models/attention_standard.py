"""Full causal attention: the Standard model (docs/method.md §1)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from anchormass.models.attention_base import SelfAttention


class StandardAttention(SelfAttention):
    """All heads attend causally to every earlier token (SDPA picks flash/memory-efficient kernels;
    enable_gqa shares each KV head with its group of query heads without copying it)."""

    def parallel_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.cfg.q_per_kv > 1)
