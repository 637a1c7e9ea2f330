"""`fifo` (docs/method.md §2.6): evict the oldest candidates; sinks and the protected recent slots stay
(StreamingLLM applied to slots). Mass is lost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from anchormass.cache.slot_policies.base import EvictionPolicy


@dataclass
class FifoEvict(EvictionPolicy):
    name: ClassVar[str] = "fifo"

    def choose_victims(self, energy: torch.Tensor, need: int) -> torch.Tensor:
        return torch.arange(need, device=energy.device)
