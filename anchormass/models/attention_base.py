"""The attention plumbing both models share: q/k/v/o projections, RoPE, and the seam to a cache.

`SelfAttention` owns the projections (no bias), applies RoPE and either hands the post-RoPE
q, k, v to the session cache (`cache.layers[idx].attend`) or runs `parallel_attention`, the one
method a model's attention class supplies.

Grouped-query attention (docs/method.md §1): k and v have `cfg.kv_heads` heads, q has `n_heads`;
query head h reads KV head h // cfg.q_per_kv (transformers' `repeat_kv` order). K/V stay at KV
heads all the way down (kernels, caches), which expand them to query heads where they attend.
"""

from __future__ import annotations

import torch
from torch import nn

from anchormass.models.config import ModelConfig
from anchormass.models.rope import apply_rope


def repeat_kv(x: torch.Tensor, q_per_kv: int) -> torch.Tensor:
    """[B, H_kv, T, D] -> [B, H_kv * q_per_kv, T, D]: KV head j copied to query heads j*g .. j*g + g - 1.
    For readers that want one K/V per query head (the dense oracle, probes); attention itself
    shares the KV heads without copying them."""
    return x if q_per_kv == 1 else x.repeat_interleave(q_per_kv, dim=1)


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.cfg = cfg
        self.layer_idx = layer_idx
        inner, kv_inner = cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, inner, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, kv_inner, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, kv_inner, bias=False)
        self.o_proj = nn.Linear(inner, cfg.d_model, bias=False)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, -1, self.cfg.head_dim).transpose(1, 2)  # [B, H or H_kv, T, D]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache=None) -> torch.Tensor:
        """x [B, T, d_model]; cos/sin [T, D] for this chunk's absolute positions, or [B, 1, T, D] when
        the sequences of a padded batch have their own RoPE bases (docs/method.md §1)."""
        b, t, _ = x.shape
        q = apply_rope(self.split_heads(self.q_proj(x)), cos, sin)
        k = apply_rope(self.split_heads(self.k_proj(x)), cos, sin)
        v = self.split_heads(self.v_proj(x))
        if cache is None:
            out = self.parallel_attention(q, k, v)
        else:
            out = self.cached_attention(cache.layers[self.layer_idx], q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))

    def cached_attention(self, layer_cache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """This layer's attention through the session cache: q [B, H, T, D]; k, v [B, H_kv, T, D]."""
        return layer_cache.attend(q, k, v)

    def parallel_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Every position at once (training, cache-free forward). q [B, H, T, D], k, v [B, H_kv, T, D],
        post-RoPE."""
        raise NotImplementedError
