"""Stage-2 slot policies (docs/method.md §2.6), chosen by name: one small file per policy."""

from __future__ import annotations

from anchormass.cache.policy import PolicyRegistry
from anchormass.cache.slot_policies.adaptive import AdaptiveMerge
from anchormass.cache.slot_policies.base import EvictionPolicy, PairMergePolicy, SlotPolicy, slot_energy
from anchormass.cache.slot_policies.fifo import FifoEvict
from anchormass.cache.slot_policies.priority import PriorityEvict
from anchormass.cache.slot_policies.score_merge import ScoreMerge
from anchormass.cache.slot_policies.uniform_merge import UniformMerge
from anchormass.models.config import SLOT_POLICIES

POLICIES = PolicyRegistry("slot policy", SlotPolicy,
                          [AdaptiveMerge, ScoreMerge, UniformMerge, PriorityEvict, FifoEvict])
# The config accepts exactly the registered names (ModelConfig.slot_policy is a Literal of them).
if sorted(POLICIES) != sorted(SLOT_POLICIES):
    raise RuntimeError(f"slot policies {sorted(POLICIES)} != models.config.SlotPolicyName {sorted(SLOT_POLICIES)}")


def get_policy(spec: "str | SlotPolicy | None", budget: int, cfg=None) -> SlotPolicy:
    """A slot policy bound to `budget` (slots per layer and sequence): by name, hyperparameters
    (protect_fraction, merge_weighting) from `cfg`, or an instance. `spec=None`: `cfg.slot_policy`."""
    if spec is None:
        spec = cfg.slot_policy if cfg is not None else "adaptive"
    hyper = {} if cfg is None else {"protect_fraction": cfg.protect_fraction, "weighting": cfg.merge_weighting}
    return POLICIES.build(spec, budget, **hyper)


__all__ = ["POLICIES", "get_policy", "SlotPolicy", "PairMergePolicy", "EvictionPolicy", "slot_energy",
           "AdaptiveMerge", "ScoreMerge", "UniformMerge", "PriorityEvict", "FifoEvict"]
