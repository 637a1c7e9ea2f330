"""Training-free KV policies for the Standard model's cache (SPEC 3), chosen by name.

`get_policy("snapkv", budget=1024)` or `get_policy(SnapKV(window=16, kernel=5), budget=1024)`
returns a validated policy; `None` means the full cache.
"""

from __future__ import annotations

from anchormass.cache.kv_policies.base import KVPolicy, attention_probs, top_positions
from anchormass.cache.kv_policies.h2o import H2O
from anchormass.cache.kv_policies.snapkv import SnapKV
from anchormass.cache.kv_policies.streaming_llm import StreamingLLM
from anchormass.errors import ConfigError

POLICIES: dict[str, type[KVPolicy]] = {cls.name: cls for cls in (SnapKV, H2O, StreamingLLM)}


def get_policy(spec: "str | KVPolicy | None", budget: int | None = None) -> KVPolicy | None:
    if spec is None or spec == "none":
        if budget is not None:
            raise ConfigError(f"a token budget ({budget}) needs a kv policy; choose one of {sorted(POLICIES)}")
        return None
    if isinstance(spec, KVPolicy):
        return spec.bind(budget)
    if isinstance(spec, str) and spec in POLICIES:
        return POLICIES[spec]().bind(budget)
    raise ConfigError(f"unknown kv policy {spec!r}; choose one of {sorted(POLICIES)} or None (full cache)")


__all__ = ["KVPolicy", "SnapKV", "H2O", "StreamingLLM", "POLICIES", "get_policy", "attention_probs",
           "top_positions"]
