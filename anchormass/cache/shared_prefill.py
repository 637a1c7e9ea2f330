"""One prefill for several Standard caches: the full cache and every KV policy at every budget.

A KV policy (docs/method.md §3) changes nothing the prompt's own forward computes when the whole
prompt is one chunk: attention during that forward always runs over the chunk's full keys, and a
policy only chooses, after the forward, what the cache keeps for decoding. So the equal-bytes
comparison (kv_frontier) can run the prompt through the model once and hand each policy's cache the
same queries, keys and values, instead of prefilling once per policy and budget. At 8K tokens that
forward is over a minute on this machine, and the decoding after it a second or two.

The lead cache (the first one) computes the attention; every other cache `ingest`s the chunk: it
stores the keys and values and lets its policy see the queries, exactly as its own `attend` would.
With a prompt in several chunks, a policy that evicts between chunks would change what the later
chunks attend to, so sharing is refused there (`check_one_chunk`).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch

from anchormass.cache.base import KVCache, LayerCache
from anchormass.cache.standard_cache import StandardCache
from anchormass.errors import ConfigError


class _SharedLayer(LayerCache):
    def __init__(self, lead, followers: list):
        self.lead, self.followers = lead, followers

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # Followers whose policies observe alike (H2O at several budgets: the same fp32 attention
        # scores, the costliest part of a long prefill after the attention itself) observe once.
        first: dict[tuple, LayerCache] = {}
        for layer in self.followers:
            key = layer.policy.observation_key() if layer.policy is not None else None
            if key is not None and key in first:
                layer.ingest_like(first[key], q, k, v)
                continue
            layer.ingest(q, k, v)
            if key is not None:
                first[key] = layer
        return self.lead.attend(q, k, v)

    def after_forward(self) -> None:
        for layer in (self.lead, *self.followers):
            layer.after_forward()

    def end_prefill(self) -> None:
        for layer in (self.lead, *self.followers):
            layer.end_prefill()

    def tensors(self) -> Iterable[torch.Tensor]:
        for layer in (self.lead, *self.followers):
            yield from layer.tensors()

    def stored_nbytes(self) -> int:
        return sum(layer.stored_nbytes() for layer in (self.lead, *self.followers))

    def stats(self) -> dict[str, list]:
        return self.lead.stats()


class SharedPrefill(KVCache):
    """Prefill-only: feed the prompt through this (generate.prefill), then decode each member cache
    on its own. Every member must be a fresh Standard cache of the same batch and RoPE base."""

    def __init__(self, caches: Sequence[StandardCache]):
        caches = list(caches)
        if not caches or any(not isinstance(c, StandardCache) for c in caches):
            raise ConfigError("a shared prefill needs one or more Standard caches")
        if any(c.seen_tokens or c.rope_base != caches[0].rope_base or c.batch_size != caches[0].batch_size
               for c in caches):
            raise ConfigError("a shared prefill needs fresh caches of one batch size and one RoPE base")
        self.members = caches
        layers = [_SharedLayer(lead, [c.layers[i] for c in caches[1:]]) for i, lead in enumerate(caches[0].layers)]
        super().__init__(layers, caches[0].batch_size)
        self.rope_base = caches[0].rope_base

    def advance(self, n_tokens: int) -> None:
        super().advance(n_tokens)  # after_forward on every member's layers, once
        for cache in self.members:
            cache.seen_tokens += n_tokens
            cache.rope_base = self.rope_base


def check_one_chunk(prompt_len: int, chunk: int) -> None:
    if chunk < prompt_len:
        raise ConfigError(f"a shared prefill needs the whole prompt in one forward (chunk {chunk} < prompt "
                          f"{prompt_len} tokens): a policy that evicts between chunks changes later chunks")
