"""AnchorMass attention: heads [0, n_local) see a sliding window, the rest the SPEC 2.2 global view.

The parallel (training) path computes exactly SPEC 2.1/2.2 for every position through one of
two kernels that give the same numbers:
  * `block_sdpa`: query chunks over SDPA with an additive bias; forward and backward anywhere.
  * `flex`: compiled FlexAttention (block mask + log-mass score_mod); GPU training, CPU forward.
`attn_impl="auto"` picks flex on CUDA and block_sdpa elsewhere.
"""

from __future__ import annotations

import torch

from anchormass.errors import ConfigError
from anchormass.models.attention_standard import SelfAttention
from anchormass.models.kernels import block_sdpa


def resolve_impl(attn_impl: str, device: torch.device) -> str:
    if attn_impl == "auto":
        return "flex" if device.type == "cuda" else "block_sdpa"
    return attn_impl


class AnchorMassAttention(SelfAttention):
    query_chunk = 256  # block_sdpa: queries per SDPA call (see kernels/block_sdpa.py)
    recompute_above = 4096  # block_sdpa training: rebuild per-chunk keys/bias in backward beyond this length

    def parallel_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cfg, nl = self.cfg, self.cfg.n_local_heads
        kernel = self._kernel(q)
        parts = []
        if nl:
            parts.append(kernel.local_attention(q[:, :nl], k[:, :nl], v[:, :nl], cfg.window,
                                                chunk=self.query_chunk))  # [B, Hl, T, D]
        parts.append(kernel.global_attention(q[:, nl:], k[:, nl:], v[:, nl:], cfg, chunk=self.query_chunk,
                                             recompute=q.shape[2] > self.recompute_above))  # [B, Hg, T, D]
        return torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]

    def _kernel(self, q: torch.Tensor):
        """The kernel module (both expose local_attention / global_attention with one signature)."""
        if resolve_impl(self.cfg.attn_impl, q.device) != "flex":
            return block_sdpa
        if q.device.type != "cuda" and torch.is_grad_enabled() and q.requires_grad:
            raise ConfigError("attn_impl='flex' has no backward on CPU (torch 2.13); "
                              "use attn_impl='block_sdpa' for CPU training")
        from anchormass.models.kernels import flex  # imported lazily: compiles on first use

        return flex
