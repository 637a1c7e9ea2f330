"""Full causal attention (the Standard model) and the projection/RoPE/cache plumbing both models share.

`SelfAttention` owns q/k/v/o projections (no bias), applies RoPE and either hands the
post-RoPE q, k, v to the session cache (`cache.layers[idx].attend`) or runs its parallel
kernel. Subclasses only replace `parallel_attention`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from anchormass.models.config import ModelConfig
from anchormass.models.rope import apply_rope


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.cfg = cfg
        self.layer_idx = layer_idx
        inner = cfg.n_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, inner, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, inner, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, inner, bias=False)
        self.o_proj = nn.Linear(inner, cfg.d_model, bias=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.cfg.n_heads, self.cfg.head_dim).transpose(1, 2)  # [B, H, T, D]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache=None) -> torch.Tensor:
        """x [B, T, d_model]; cos/sin [T, D] for this chunk's absolute positions."""
        b, t, _ = x.shape
        q = apply_rope(self._heads(self.q_proj(x)), cos, sin)
        k = apply_rope(self._heads(self.k_proj(x)), cos, sin)
        v = self._heads(self.v_proj(x))
        if cache is None:
            out = self.parallel_attention(q, k, v)
        else:
            out = cache.layers[self.layer_idx].attend(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def parallel_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, D]


class StandardAttention(SelfAttention):
    """All heads attend causally to every earlier token (SDPA picks flash/memory-efficient kernels)."""
