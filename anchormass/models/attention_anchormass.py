"""AnchorMass attention: heads [0, n_local) see a sliding window, the rest the global view
(docs/method.md §2.1, §2.2). With GQA the split falls between KV groups: the local query heads
read KV heads [0, n_local / q_per_kv), the global ones the rest.

The parallel (training) path runs the kernel object chosen once from `cfg.attn_impl`
(see anchormass/models/kernels/__init__.py); the cache path is the base class's. Both hand
stage 1 the layer's learned outlier scorer when `cfg.outlier_scorer` is "learned".
"""

from __future__ import annotations

import torch
from torch import nn

from anchormass.models.attention_base import SelfAttention
from anchormass.models.config import ModelConfig
from anchormass.models.kernels import make_kernel

OUTLIER_SCORE = "outlier_score"  # the learned scorer's parameter name (outlier_scorer="learned")


class AnchorMassAttention(SelfAttention):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__(cfg, layer_idx)
        self.kernel = make_kernel(cfg)
        # The learned outlier scorer (docs/method.md §2.3): token i of a group scores
        # sum_h <outlier_score[h], v[h, i]> over the global KV heads. Zero at init (LanguageModel.
        # reset_parameters): it draws no random numbers, so every other weight equals the rule model's
        # at the same seed, and its gradient is not zero there (scores are linear in it, the softmax
        # is uniform), so it moves from its first step; until then each group keeps its first token.
        self.outlier_score = (nn.Parameter(torch.zeros(cfg.n_global_kv_heads, cfg.head_dim))
                              if cfg.outlier_scorer == "learned" else None)

    def parallel_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        nl, nkl = self.cfg.n_local_heads, self.cfg.n_local_kv_heads
        if not nl:
            return self.kernel.global_attention(q, k, v, self.outlier_score)
        local = self.kernel.local_attention(q[:, :nl], k[:, :nkl], v[:, :nkl])  # [B, Hl, T, D]
        glob = self.kernel.global_attention(q[:, nl:], k[:, nkl:], v[:, nkl:], self.outlier_score)  # [B, Hg, T, D]
        return torch.cat([local, glob], dim=1)

    def cached_attention(self, layer_cache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.outlier_score is None:
            return layer_cache.attend(q, k, v)
        return layer_cache.attend(q, k, v, scorer=self.outlier_score)
