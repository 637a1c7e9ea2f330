"""`adaptive` (docs/method.md §2.6, the default): merge the adjacent candidate pairs of lowest energy sum.

Merged value: energy-weighted mean (e_a v_a + e_b v_b) / (e_a + e_b), mass-weighted when both
energies are 0 or when `weighting="mass"` (the ablation). Merged key: the key of the
higher-energy slot (the newer one on a tie), in both weightings: averaging RoPE-rotated keys
would mix phases. Ties between pair sums go to the older pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from anchormass.cache.slot_policies.base import PairMergePolicy, weighted_mean
from anchormass.errors import ConfigError
from anchormass.models.config import MERGE_WEIGHTINGS


@dataclass
class AdaptiveMerge(PairMergePolicy):
    weighting: str = "energy"

    name: ClassVar[str] = "adaptive"

    def resolve(self) -> None:
        super().resolve()
        if self.weighting not in MERGE_WEIGHTINGS:
            raise ConfigError(f"merge weighting must be one of {MERGE_WEIGHTINGS}, got {self.weighting!r}")

    def choose_pairs(self, e_a: torch.Tensor, e_b: torch.Tensor, k: int) -> torch.Tensor:
        return torch.argsort(e_a + e_b, stable=True)[:k]

    def combine(self, k_a, k_b, v_a, v_b, n_a, n_b, e_a, e_b):
        if self.weighting == "energy":
            by_mass = (e_a + e_b) == 0  # [k]: both energies 0 -> fall back to masses
            w_a, w_b = torch.where(by_mass, n_a, e_a), torch.where(by_mass, n_b, e_b)
        else:
            w_a, w_b = n_a, n_b
        key = torch.where((e_b >= e_a)[None, :, None], k_b, k_a)  # [Hg, k, D]
        return key, weighted_mean(v_a, v_b, w_a, w_b)
