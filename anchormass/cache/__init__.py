"""Inference caches: `new_cache(model, ...)` / `make_cache(cfg, ...)` pick the cache of the model's architecture.

Dependencies point one way: the caches use `anchormass.models` (config, stage-1 compression);
the model only consumes a cache it is given and never imports this package.
"""

from __future__ import annotations

import torch

from anchormass.errors import ConfigError


def new_cache(model, batch_size: int = 1, policy=None, budget=None, dtype: torch.dtype | None = None):
    """A fresh session cache for `model`, on the model's device.

    dtype: the autocast dtype when autocast is on for the device (bf16 on GPU, so the cache
    holds what attention computes with), else the parameters' dtype, unless given.
    """
    p = next(model.parameters())
    if dtype is None:
        autocast_on = torch.is_autocast_enabled(p.device.type)
        dtype = torch.get_autocast_dtype(p.device.type) if autocast_on else p.dtype
    return make_cache(model.cfg, batch_size=batch_size, policy=policy, budget=budget, device=p.device, dtype=dtype)


def make_cache(cfg, batch_size: int = 1, policy=None, budget=None, device=None, dtype=None):
    """A fresh cache for one session of `batch_size` sequences.

    AnchorMass: `policy` is a slot-policy name (docs/method.md §2.6) or instance, default `cfg.slot_policy`;
    `budget` in global slots per layer and sequence, default `cfg.slot_budget`.
    Standard: `policy` in {None, snapkv, h2o, streaming_llm}, `budget` in tokens (StandardCache).
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    if cfg.arch == "standard":
        from anchormass.cache.standard_cache import StandardCache

        return StandardCache(cfg, batch_size, policy=policy, budget=budget, device=device, dtype=dtype)

    from anchormass.cache.anchormass_cache import AnchorMassCache
    from anchormass.cache.slot_policies import get_policy

    if budget is None:  # a policy instance may carry its own budget
        budget = getattr(policy, "budget", None) or cfg.slot_budget
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ConfigError(f"slot budget must be a positive integer (slots), got {budget!r}")
    return AnchorMassCache(cfg, batch_size, get_policy(policy, budget, cfg), device=device, dtype=dtype)


__all__ = ["make_cache", "new_cache"]
