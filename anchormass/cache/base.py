"""What every inference cache offers the model, the generator and the benchmarks.

A cache is one object per session (one prompt and its generation, any batch size). The model
fills it chunk by chunk: each attention layer calls `layers[i].attend(q, k, v)` with post-RoPE
queries/keys at absolute positions `seen_tokens + arange(T)`, and the model calls `advance(T)`
once after all layers have run.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch


class LayerCache:
    """One layer's state. Subclasses implement `attend` and `tensors`."""

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Append this chunk's k, v ([B, H, T, D]) and return attention output [B, H, T, D]."""
        raise NotImplementedError

    def tensors(self) -> Iterable[torch.Tensor]:
        """Every tensor this layer holds (for measured byte accounting)."""
        raise NotImplementedError

    def stored_nbytes(self) -> int:
        """Bytes of what this layer keeps for later tokens (see KVCache.stored_nbytes)."""
        raise NotImplementedError

    def after_forward(self) -> None:
        """Called once per model forward, after every layer attended (e.g. stage 2 runs here)."""

    def end_prefill(self) -> None:
        """Called once when the whole prompt has been prefilled (e.g. SnapKV compresses here)."""

    def stats(self) -> dict[str, list]:
        """{'slots': [...], 'mass': [...]} for this layer, one entry per sequence (see KVCache.stats)."""
        raise NotImplementedError


class KVCache:
    """A list of layer caches plus the session state shared by all layers."""

    def __init__(self, layers: Sequence[LayerCache], batch_size: int):
        self.layers = list(layers)
        self.batch_size = batch_size
        self.seen_tokens = 0
        # RoPE base of this session, fixed at prefill (docs/method.md §1). None until the first forward.
        self.rope_base: float | None = None

    def advance(self, n_tokens: int) -> None:
        self.seen_tokens += n_tokens
        for layer in self.layers:
            layer.after_forward()

    def end_prefill(self) -> None:
        for layer in self.layers:
            layer.end_prefill()

    @property
    def nbytes(self) -> int:
        """Measured: the bytes of every tensor the cache holds, buffers included.

        A tensor listed twice (the same memory, shape and dtype) counts once. Identity is the
        memory address, not id(): layers may hand out fresh views whose ids Python reuses."""
        seen: set[tuple] = set()
        total = 0
        for layer in self.layers:
            for t in layer.tensors():
                key = None if t is None else (t.data_ptr(), tuple(t.shape), t.dtype)
                if key is None or key in seen:
                    continue
                seen.add(key)
                total += t.numel() * t.element_size()
        return total

    @property
    def stored_nbytes(self) -> int:
        """Measured: the bytes of the keys, values and masses the cache keeps (all layers and
        sequences), whatever buffers hold them. `nbytes` is what is allocated; the two differ by
        spare capacity and per-token bookkeeping (positions, H2O scores), which are not stored KV.
        Equal-memory comparisons match methods on this figure (docs/method.md §6)."""
        return sum(layer.stored_nbytes() for layer in self.layers)

    def stats(self) -> dict:
        """'tokens': tokens seen; 'slots' and 'mass' as [layer][sequence] lists, whatever the batch
        size: global slots stored (Standard: tokens kept) and the total mass the global heads
        represent (sinks + slots + tail; Standard: tokens kept)."""
        per_layer = [layer.stats() for layer in self.layers]
        return {
            "tokens": self.seen_tokens,
            "slots": [s["slots"] for s in per_layer],
            "mass": [s["mass"] for s in per_layer],
        }
