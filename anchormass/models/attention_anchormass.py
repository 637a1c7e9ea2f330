"""AnchorMass attention: heads [0, n_local) see a sliding window, the rest the global view
(docs/method.md §2.1, §2.2). With GQA the split falls between KV groups: the local query heads
read KV heads [0, n_local / q_per_kv), the global ones the rest.

The parallel (training) path runs the kernel object chosen once from `cfg.attn_impl`
(see anchormass/models/kernels/__init__.py); the cache path is the base class's.
"""

from __future__ import annotations

import torch

from anchormass.models.attention_base import SelfAttention
from anchormass.models.config import ModelConfig
from anchormass.models.kernels import make_kernel


class AnchorMassAttention(SelfAttention):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.kernel = make_kernel(cfg)

    def parallel_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        nl, nkl = self.cfg.n_local_heads, self.cfg.n_local_kv_heads
        if not nl:
            return self.kernel.global_attention(q, k, v)
        local = self.kernel.local_attention(q[:, :nl], k[:, :nkl], v[:, :nkl])  # [B, Hl, T, D]
        glob = self.kernel.global_attention(q[:, nl:], k[:, nkl:], v[:, nkl:])  # [B, Hg, T, D]
        return torch.cat([local, glob], dim=1)
