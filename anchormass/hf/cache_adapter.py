"""Our session cache (anchormass.cache) behind the `transformers` `Cache` interface.

`generate()` only asks a cache how many tokens it has seen (to slice the next input) and hands
it back to the model's forward; the AnchorMass layers attend through our own cache objects
(`cache.layers[i].attend`), never through `Cache.update`. So the adapter holds one of our
session caches (`session`, built by the first forward, when the batch size and device are
known) and answers the length questions from it. The stage-2 policy and slot budget are fixed
when the adapter is made, like `anchormass.cache.new_cache(model, batch, policy, budget)`.

Beam search, assisted decoding and cache cropping would need to reorder or roll back the
fixed-budget store, which stage 2 has already merged: they are refused.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from anchormass.cache import new_cache


class _SessionLayer(CacheLayerMixin):
    """One model layer as `transformers` sees it: a length, read from the shared session."""

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self, owner: "AnchorMassHFCache"):
        # No keys/values here: the state lives in owner.session (see the module docstring).
        self.owner = owner

    @property
    def is_initialized(self) -> bool:
        return self.owner.session is not None

    def lazy_initialization(self, key_states, value_states) -> None:
        raise NotImplementedError("AnchorMass layers store their state in anchormass.cache, not through Cache.update")

    def update(self, key_states, value_states, *args, **kwargs):
        raise NotImplementedError("AnchorMass layers store their state in anchormass.cache, not through Cache.update")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.get_seq_length()

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.owner.session = None

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("beam search cannot reorder a merged fixed-budget cache")


class AnchorMassHFCache(Cache):
    """A `transformers` Cache wrapping one AnchorMass (or Standard) session cache.

    policy / budget: as for `anchormass.cache.new_cache` (None: the model config's defaults).
    """

    def __init__(self, n_layers: int, policy: str | None = None, budget: int | None = None):
        super().__init__(layers=[_SessionLayer(self) for _ in range(n_layers)])
        self.policy, self.budget = policy, budget
        self.session = None  # anchormass KVCache, made by `start`

    def start(self, model, batch_size: int):
        """Open the session for `model` (our LanguageModel) and `batch_size` sequences."""
        self.session = new_cache(model, batch_size=batch_size, policy=self.policy, budget=self.budget)
        return self.session

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.session is None else self.session.seen_tokens

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    @property
    def nbytes(self) -> int:
        """Bytes the session cache holds (measured; see anchormass.cache.base.KVCache.nbytes)."""
        return 0 if self.session is None else self.session.nbytes

    def reset(self) -> None:
        self.session = None

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("beam search cannot reorder a merged fixed-budget cache")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a fixed-budget cache cannot be rolled back (assisted decoding is not supported)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("expand the prompts before generating instead of repeating the cache")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("selecting sequences out of an open session is not supported")
