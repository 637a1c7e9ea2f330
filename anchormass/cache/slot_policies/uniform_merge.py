"""`uniform_merge` (docs/method.md §2.6): merge the oldest candidate pairs in order, ignoring energy.

Merged value: mass-weighted mean; merged key: the key of the later (newer) slot of the pair,
like the anchor key of stage 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from anchormass.cache.slot_policies.base import PairMergePolicy, weighted_mean


@dataclass
class UniformMerge(PairMergePolicy):
    name: ClassVar[str] = "uniform_merge"

    def choose_pairs(self, e_a: torch.Tensor, e_b: torch.Tensor, k: int) -> torch.Tensor:
        return torch.arange(k, device=e_a.device)

    def combine(self, k_a, k_b, v_a, v_b, n_a, n_b, e_a, e_b):
        return k_b, weighted_mean(v_a, v_b, n_a, n_b)
