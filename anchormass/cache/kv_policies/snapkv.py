"""SnapKV (docs/method.md §3): the prompt's last `window` queries vote once, after prefill, for the prefix
tokens each head keeps; the window itself is always kept.

Vote = softmax attention (fp32) of the window queries over every prompt key, causal inside the
window (as in the original implementation the softmax normalises over prefix + window keys),
summed over the window queries and restricted to the prefix columns. A 1-D pooling (max | avg,
odd kernel, stride 1, padding k//2; avg counts the zero padding) spreads each score to its
neighbours so whole clusters survive. With grouped-query attention each query head's pooled vote
is computed as above and a KV head's vote is their mean over its group (pooling first, then the
mean, as kvpress's SnapKV does). Each KV head keeps its top-(budget - window) prefix positions
(ties to the earlier one) in chronological order, then the window. The prefill attention itself
is full; the cache only shrinks at `end_prefill`, and decoding appends to it without further
compression (budget bounds the compressed prompt, not the generation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from anchormass.cache.kv_policies.base import KVPolicy, attention_probs, kv_group_mean, top_positions
from anchormass.errors import ConfigError

POOLINGS = ("max", "avg")
QUERY_STATE = "snapkv_q"  # layer.state key: the last `window` prompt queries, kept until end_prefill


@dataclass
class SnapKV(KVPolicy):
    name: ClassVar[str] = "snapkv"

    window: int = 32  # observation window: the last prompt queries, always kept
    kernel: int = 7  # pooling kernel (odd)
    pooling: str = "max"  # "max" | "avg"

    def resolve(self) -> None:
        super().resolve()
        if self.window < 1:
            raise ConfigError(f"snapkv: window must be >= 1, got {self.window}")
        if self.kernel < 1 or self.kernel % 2 == 0:
            raise ConfigError(f"snapkv: pooling kernel must be odd and >= 1 (padding k//2 keeps the length), "
                              f"got {self.kernel}")
        if self.pooling not in POOLINGS:
            raise ConfigError(f"snapkv: pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.budget < self.window:
            raise ConfigError(f"snapkv: budget ({self.budget}) must be >= window ({self.window}); "
                              f"the window is always kept")

    # ------------------------------------------------------------ the maths
    def votes(self, q_obs: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """q_obs: [B, H, w, D], the last w prompt queries; k: [B, H_kv, L, D], all prompt keys.
        Returns the pooled votes over the prefix per KV head, [B, H_kv, L - w] (fp32)."""
        w, length = q_obs.shape[2], k.shape[2]
        probs = attention_probs(q_obs, k, first_query_slot=length - w)  # [B, H, w, L]
        votes = probs[..., : length - w].sum(dim=2)  # [B, H, L - w]
        b, h, n = votes.shape
        flat = votes.reshape(b * h, 1, n)
        pad = self.kernel // 2
        if self.pooling == "max":
            pooled = F.max_pool1d(flat, self.kernel, stride=1, padding=pad)
        else:
            pooled = F.avg_pool1d(flat, self.kernel, stride=1, padding=pad, count_include_pad=True)
        return kv_group_mean(pooled.reshape(b, h, n), k.shape[1])

    def select(self, q_obs: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Stored slots to keep, [B, H_kv, budget]: top prefix positions (ascending) then the window."""
        w, length = q_obs.shape[2], k.shape[2]
        chosen = top_positions(self.votes(q_obs, k), self.budget - w)  # [B, H_kv, budget - w]
        window = torch.arange(length - w, length, device=k.device).expand(*chosen.shape[:2], w)
        return torch.cat([chosen, window], dim=-1)

    # ------------------------------------------------------------ hooks
    def on_attend(self, layer, q: torch.Tensor) -> None:
        if not layer.prefilling:
            return
        # Keep the most recent `window` queries across prefill chunks (one small cat per chunk).
        prev = layer.state.get(QUERY_STATE)
        recent = q if prev is None else torch.cat([prev, q.to(prev.dtype)], dim=2)
        layer.state[QUERY_STATE] = recent[:, :, -self.window:].contiguous()

    def end_prefill(self, layer) -> None:
        q_obs = layer.state.pop(QUERY_STATE, None)
        if q_obs is None or layer.length <= self.budget:
            return  # the prompt fits: nothing to compress
        layer.keep(self.select(q_obs, layer.keys()))
