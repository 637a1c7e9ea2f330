"""Stage-2 slot policies (SPEC 2.6), chosen by name: one small file per policy."""

from __future__ import annotations

from anchormass.cache.slot_policies.adaptive import AdaptiveMerge
from anchormass.cache.slot_policies.base import (EvictionPolicy, PairMergePolicy, SlotPolicy,
                                                 slot_energy)
from anchormass.cache.slot_policies.fifo import FifoEvict
from anchormass.cache.slot_policies.priority import PriorityEvict
from anchormass.cache.slot_policies.score_merge import ScoreMerge
from anchormass.cache.slot_policies.uniform_merge import UniformMerge
from anchormass.errors import ConfigError

REGISTRY: dict[str, type[SlotPolicy]] = {
    cls.name: cls for cls in (AdaptiveMerge, ScoreMerge, UniformMerge, PriorityEvict, FifoEvict)
}


def make_slot_policy(spec: "str | SlotPolicy | None", cfg=None) -> SlotPolicy:
    """A policy by name (hyperparameters from `cfg`: protect_fraction, merge_weighting) or an instance.

    `spec=None` means `cfg.slot_policy`.
    """
    if isinstance(spec, SlotPolicy):
        return spec
    name = spec if spec is not None else (cfg.slot_policy if cfg is not None else "adaptive")
    if name not in REGISTRY:
        raise ConfigError(f"unknown slot policy {name!r}; choose one of {sorted(REGISTRY)}")
    cls = REGISTRY[name]
    kwargs = {}
    if cfg is not None:
        kwargs["protect_fraction"] = cfg.protect_fraction
        if issubclass(cls, AdaptiveMerge):
            kwargs["weighting"] = cfg.merge_weighting
    return cls(**kwargs)


__all__ = ["REGISTRY", "make_slot_policy", "SlotPolicy", "PairMergePolicy", "EvictionPolicy", "slot_energy",
           "AdaptiveMerge", "ScoreMerge", "UniformMerge", "PriorityEvict", "FifoEvict"]
