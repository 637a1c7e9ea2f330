"""`priority` (docs/method.md §2.6): evict the lowest-energy candidates (the older one on a tie); mass is lost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from anchormass.cache.slot_policies.base import EvictionPolicy


@dataclass
class PriorityEvict(EvictionPolicy):
    name: ClassVar[str] = "priority"

    def choose_victims(self, energy: torch.Tensor, need: int) -> torch.Tensor:
        return torch.argsort(energy, stable=True)[:need]
