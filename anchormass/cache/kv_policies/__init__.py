"""Training-free KV policies for the Standard model's cache (docs/method.md §3), chosen by name.

`get_policy("snapkv", budget=1024)` or `get_policy(SnapKV(window=16, kernel=5), budget=1024)`
returns a validated policy; `None` means the full cache.
"""

from __future__ import annotations

from anchormass.cache.kv_policies.base import KVPolicy, attention_probs, kv_group_mean, top_positions
from anchormass.cache.kv_policies.h2o import H2O
from anchormass.cache.kv_policies.snapkv import SnapKV
from anchormass.cache.kv_policies.streaming_llm import StreamingLLM
from anchormass.cache.policy import PolicyRegistry
from anchormass.errors import ConfigError

POLICIES = PolicyRegistry("kv policy", KVPolicy, [SnapKV, H2O, StreamingLLM])


def get_policy(spec: "str | KVPolicy | None", budget: int | None = None) -> KVPolicy | None:
    if spec is None or spec == "none":
        if budget is not None:
            raise ConfigError(f"a token budget ({budget}) needs a kv policy; choose one of {sorted(POLICIES)}")
        return None
    return POLICIES.build(spec, budget)


__all__ = ["KVPolicy", "SnapKV", "H2O", "StreamingLLM", "POLICIES", "get_policy", "attention_probs",
           "kv_group_mean", "top_positions"]
