"""Stage 2 (docs/method.md §2.6): what a slot policy is, and the two mechanisms policies share.

A policy (anchormass/cache/policy.py: a dataclass, budget bound up front, in slots per layer
and sequence) sees ONE sequence's global slot store, oldest slot first:
    keys, values [Hg, n, D] (keys post-RoPE; Hg = the global KV heads, fewer than the global
    query heads under grouped-query attention), mass [n] (float, every stored slot has mass > 0)
and returns a store of at most `budget` slots, still chronological. Sinks live elsewhere
in the cache and never reach a policy. Inputs are never modified in place (they are views
of the cache's buffers); the cache writes the result back.

Candidates are the oldest n - P slots, P = int(budget * protect_fraction) the protected
recent slots (P = 0 for policies that protect nothing). Since P < budget, a store over
budget always has >= 2 candidates, so every round makes progress.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from anchormass.cache.policy import Policy
from anchormass.models.config import check_protect_fraction

Store = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # keys [Hg, n, D], values [Hg, n, D], mass [n]


def slot_energy(values: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """e_j = mean_h |v[h, j]| * log(1 + n_j): values [Hg, n, D], mass [n] -> [n] (fp32)."""
    return values.float().norm(dim=-1).mean(dim=0) * torch.log1p(mass.float())


def _drop(store: Store, index: torch.Tensor) -> Store:
    """Remove the slots at `index` (keeps chronological order)."""
    keys, values, mass = store
    keep = torch.ones(mass.shape[0], dtype=torch.bool, device=mass.device)
    keep[index] = False
    return keys[:, keep], values[:, keep], mass[keep]


@dataclass
class SlotPolicy(Policy):
    """Removes slots until the store fits the budget, in as many rounds as needed."""

    protect_fraction: float = 0.25

    protects_recent: ClassVar[bool] = True

    def resolve(self) -> None:
        super().resolve()
        check_protect_fraction(self.protect_fraction)

    def n_protected(self) -> int:
        return int(self.budget * self.protect_fraction) if self.protects_recent else 0

    def reduce(self, keys: torch.Tensor, values: torch.Tensor, mass: torch.Tensor) -> Store:
        budget = self.budget
        store = (keys, values, mass)
        while store[2].shape[0] > budget:
            n = store[2].shape[0]
            n_cand = n - self.n_protected()
            store = self.round(store, n_cand, need=n - budget)
            if store[2].shape[0] >= n:  # cannot happen for budget >= 2; guards an endless loop
                raise RuntimeError(f"slot policy {self.name!r} made no progress at {n} slots, budget {budget}")
        return store

    def round(self, store: Store, n_cand: int, need: int) -> Store:
        """One round over the first `n_cand` slots; should remove up to `need` slots."""
        raise NotImplementedError


@dataclass
class PairMergePolicy(SlotPolicy):
    """Merges disjoint adjacent candidate pairs (c0, c1), (c2, c3), ...: one slot fewer per pair.

    Subclasses say which pairs (`choose_pairs`) and how two slots become one (`combine`).
    A merged slot takes the place of the pair, so the store stays chronological; its mass is
    n_a + n_b, so total mass is conserved exactly.
    """

    def round(self, store: Store, n_cand: int, need: int) -> Store:
        keys, values, mass = store
        n_pairs = n_cand // 2
        energy = slot_energy(values, mass)  # [n]
        pairs = self.choose_pairs(energy[0:2 * n_pairs:2], energy[1:2 * n_pairs:2], min(need, n_pairs))
        a, b = 2 * pairs, 2 * pairs + 1  # [k] older / newer slot of each chosen pair
        new_k, new_v = self.combine(keys[:, a], keys[:, b], values[:, a], values[:, b],
                                    mass[a], mass[b], energy[a], energy[b])
        keys, values, mass = keys.clone(), values.clone(), mass.clone()
        keys[:, a], values[:, a] = new_k, new_v
        mass[a] = mass[a] + mass[b]
        return _drop((keys, values, mass), b)

    def choose_pairs(self, e_a: torch.Tensor, e_b: torch.Tensor, k: int) -> torch.Tensor:
        """Indices (into the n_pairs pairs) of the k pairs to merge this round."""
        raise NotImplementedError

    def combine(self, k_a, k_b, v_a, v_b, n_a, n_b, e_a, e_b) -> tuple[torch.Tensor, torch.Tensor]:
        """k_*, v_* [Hg, k, D]; n_*, e_* [k] -> merged keys, values [Hg, k, D]."""
        raise NotImplementedError


def weighted_mean(v_a: torch.Tensor, v_b: torch.Tensor, w_a: torch.Tensor, w_b: torch.Tensor) -> torch.Tensor:
    """(w_a v_a + w_b v_b) / (w_a + w_b) per pair: v_* [Hg, k, D], w_* [k] (sum > 0)."""
    w_a = w_a.to(v_a.dtype)[None, :, None]
    w_b = w_b.to(v_a.dtype)[None, :, None]
    return (w_a * v_a + w_b * v_b) / (w_a + w_b)


@dataclass
class EvictionPolicy(SlotPolicy):
    """Drops `need` candidates in one round (mass is lost)."""

    def round(self, store: Store, n_cand: int, need: int) -> Store:
        keys, values, mass = store
        victims = self.choose_victims(slot_energy(values[:, :n_cand], mass[:n_cand]), need)
        return _drop(store, victims)

    def choose_victims(self, energy: torch.Tensor, need: int) -> torch.Tensor:
        """energy [n_cand] of the candidates -> indices of the `need` slots to drop."""
        raise NotImplementedError
