"""H2O, heavy hitters (docs/method.md §3): every cached key accumulates the attention it receives (summed
over all queries that saw it, per head and sequence); once the cache is over budget after a
forward, keep the `recent` most recent tokens plus the `heavy` highest-scoring older ones.
With grouped-query attention a KV head's score is the mean over its group's query heads of what
each received (kv_policies/base.py).

Scores are fp32 probabilities computed beside the SDPA output (so outputs match the full cache
exactly until the first eviction). A long prompt prefilled in chunks is evicted at the end of
each chunk; prefilled in one chunk it is exactly H2O's prompt selection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from anchormass.cache.kv_policies.base import KVPolicy, attention_received, kv_group_mean, top_positions
from anchormass.errors import ConfigError

SCORE_AUX = "h2o_score"


@dataclass
class H2O(KVPolicy):
    name: ClassVar[str] = "h2o"
    bounded: ClassVar[bool] = True

    heavy: int | None = None  # default: budget - recent
    recent: int | None = None  # default: budget // 2
    query_chunk: int = 256  # queries per fp32 probability block (bounds memory in long prefills)

    def bind(self, budget):
        if budget is None and self.budget is None and self.heavy is not None and self.recent is not None:
            budget = self.heavy + self.recent
        return super().bind(budget)

    def resolve(self) -> None:
        super().resolve()
        if self.recent is None:
            self.recent = self.budget // 2 if self.heavy is None else self.budget - self.heavy
        if self.heavy is None:
            self.heavy = self.budget - self.recent
        if self.heavy < 0 or self.recent < 0 or self.heavy + self.recent != self.budget:
            raise ConfigError(f"h2o: need heavy + recent = budget with both >= 0, "
                              f"got heavy={self.heavy}, recent={self.recent}, budget={self.budget}")
        if self.query_chunk < 1:
            raise ConfigError(f"h2o: query_chunk must be >= 1, got {self.query_chunk}")

    def observation_key(self) -> tuple:
        return (self.name, self.query_chunk)  # its scores do not depend on heavy, recent or the budget

    def on_attend(self, layer, q: torch.Tensor) -> None:
        if SCORE_AUX not in layer.aux:
            layer.add_aux(SCORE_AUX, torch.float32)
        score = layer.aux[SCORE_AUX]  # [B, H_kv, cap]; new slots start at 0
        keys, t = layer.keys(), q.shape[2]
        first = layer.length - t
        for s in range(0, t, self.query_chunk):
            part = q[:, :, s:s + self.query_chunk]
            stop = first + s + part.shape[2]  # keys beyond the last query of this part are masked anyway
            got = attention_received(part, keys[:, :, :stop], first_query_slot=first + s)  # [B, H, stop]
            score[:, :, :stop] += kv_group_mean(got, layer.n_kv_heads)

    def after_forward(self, layer) -> None:
        n = layer.length
        if n <= self.budget:
            return
        old = n - self.recent  # slots [0, old) compete on score; the rest are the recent ones
        score = layer.aux[SCORE_AUX][:, :, :old]
        heavy = top_positions(score, self.heavy)  # [B, H_kv, heavy]
        recent = torch.arange(old, n, device=heavy.device).expand(*heavy.shape[:2], self.recent)
        layer.keep(torch.cat([heavy, recent], dim=-1))
