"""Inner attention kernels for the AnchorMass parallel path (docs/method.md §2.4).

An attention module holds one kernel object, chosen from `cfg.attn_impl` when the module is
built. Every kernel answers the same two questions for post-RoPE q [B, H, T, D] and k, v
[B, H_kv, T, D] (H_kv = H / q_per_kv, grouped-query attention):
`local_attention` (the sliding-window heads) and `global_attention` (sinks + slots with
+log(mass) + the query's own block; `scorer`: the layer's learned outlier scorer, or None for
the rule), and gives the same numbers:
  * `block_sdpa.BlockSdpaKernel`: query chunks over SDPA with an additive bias; fwd + bwd anywhere.
  * `flex.FlexKernel`: compiled FlexAttention; CUDA fwd + bwd, CPU forward only.
  * `AutoKernel`: FlexAttention on CUDA tensors, block-wise SDPA on any other device.
"""

from __future__ import annotations

from typing import Protocol

import torch

from anchormass.models.config import ModelConfig


class AttentionKernel(Protocol):
    def local_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Sliding window of `cfg.window` keys, the query included. q [B, Hl, T, D] -> [B, Hl, T, D]."""

    def global_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         scorer: torch.Tensor | None = None) -> torch.Tensor:
        """docs/method.md §2.2 for every position. q [B, Hg, T, D] -> [B, Hg, T, D]."""


class AutoKernel:
    """FlexAttention for CUDA tensors, block-wise SDPA elsewhere. A module is built before it is
    moved to its device, so the choice is made per device type, once, on first use."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self._by_device: dict[str, AttentionKernel] = {}

    def _for(self, q: torch.Tensor) -> AttentionKernel:
        kind = q.device.type
        if kind not in self._by_device:
            self._by_device[kind] = make_kernel(self.cfg, "flex" if kind == "cuda" else "block_sdpa")
        return self._by_device[kind]

    def local_attention(self, q, k, v):
        return self._for(q).local_attention(q, k, v)

    def global_attention(self, q, k, v, scorer=None):
        return self._for(q).global_attention(q, k, v, scorer)


def make_kernel(cfg: ModelConfig, impl: str | None = None) -> AttentionKernel:
    """The kernel object for `impl` (default: `cfg.attn_impl`)."""
    impl = cfg.attn_impl if impl is None else impl
    if impl == "auto":
        return AutoKernel(cfg)
    if impl == "flex":
        from anchormass.models.kernels.flex import FlexKernel  # imported on demand: it sets up torch.compile

        return FlexKernel(cfg)
    from anchormass.models.kernels.block_sdpa import BlockSdpaKernel

    return BlockSdpaKernel(cfg)
