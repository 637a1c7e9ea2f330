"""StreamingLLM (docs/method.md §3): keep the first `sinks` tokens and the most recent budget - sinks;
evict after every forward once over budget.

Positions: keys are stored post-RoPE at their ORIGINAL positions and new queries use their true
positions. (The StreamingLLM paper re-numbers positions inside the cache; we do not, so this is
the same cache a Standard model sees without re-rotation, and relative distances are the true
ones. Document any comparison accordingly.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from anchormass.cache.kv_policies.base import KVPolicy
from anchormass.errors import ConfigError


@dataclass
class StreamingLLM(KVPolicy):
    name: ClassVar[str] = "streaming_llm"
    bounded: ClassVar[bool] = True

    sinks: int = 4

    def resolve(self) -> None:
        super().resolve()
        if self.sinks < 0 or self.sinks >= self.budget:
            raise ConfigError(f"streaming_llm: need 0 <= sinks < budget, got sinks={self.sinks}, budget={self.budget}")

    def after_forward(self, layer) -> None:
        n = layer.length
        if n <= self.budget:
            return
        # Slots are chronological and the sinks are never evicted, so they are slots [0, sinks).
        idx = torch.cat([torch.arange(self.sinks), torch.arange(n - (self.budget - self.sinks), n)])
        idx = idx.to(layer.k.device).expand(layer.batch_size, layer.n_kv_heads, self.budget)
        layer.keep(idx)
