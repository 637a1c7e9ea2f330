"""Inference caches: `make_cache` picks the cache of the model's architecture.

Imports happen inside `make_cache` so that `anchormass.models` (which calls it from
`new_cache`) and the caches (which use `anchormass.models.compression`) can import each other.
"""

from __future__ import annotations

from anchormass.errors import ConfigError


def make_cache(cfg, batch_size: int = 1, policy=None, budget=None, device=None, dtype=None):
    """A fresh cache for one session of `batch_size` sequences.

    AnchorMass: `policy` is a slot-policy name (SPEC 2.6) or instance, default `cfg.slot_policy`;
    `budget` in global slots per layer and sequence, default `cfg.slot_budget`.
    Standard: `policy` in {None, snapkv, h2o, streaming_llm}, `budget` in tokens (StandardCache).
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    if cfg.arch == "standard":
        from anchormass.cache.standard_cache import StandardCache

        return StandardCache(cfg, batch_size, policy=policy, budget=budget, device=device, dtype=dtype)

    from anchormass.cache.anchormass_cache import AnchorMassCache
    from anchormass.cache.slot_policies import make_slot_policy

    budget = cfg.slot_budget if budget is None else budget
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ConfigError(f"slot budget must be a positive integer (slots), got {budget!r}")
    return AnchorMassCache(cfg, batch_size, make_slot_policy(policy, cfg), budget, device=device, dtype=dtype)


__all__ = ["make_cache"]
