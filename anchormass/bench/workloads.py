"""The measured sessions, written against the SPEC 7 contract only (`model(ids)`,
`anchormass.cache.new_cache`, `model(chunk, cache=cache)`, `generate.prefill`, `cache.nbytes`,
`cache.stats()`), so they run unchanged on both architectures."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from anchormass.cache import new_cache
from anchormass.inference import generate  # the module


def random_ids(vocab_size: int, batch: int, length: int, seed: int, device) -> torch.Tensor:
    """Token ids [batch, length]; the same seed gives the same prompt to both models."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, length), generator=gen).to(device)


@torch.no_grad()
def prefill(model, ids: torch.Tensor, policy: str | None, budget: int | None, chunk: int):
    """A fresh session: new cache + chunked prefill. Returns (cache, next token [B, 1])."""
    cache = new_cache(model, batch_size=ids.shape[0], policy=policy, budget=budget)
    logits = generate.prefill(model, ids, cache, chunk)  # [B, V]: the last position only
    return cache, logits.argmax(-1, keepdim=True)


@torch.no_grad()
def decode(model, cache, token: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """Greedy decoding of n_tokens through the cache; returns the next token [B, 1]."""
    for _ in range(n_tokens):
        token = model(token, cache=cache)[:, -1].argmax(-1, keepdim=True)
    return token


def train_step(model, ids: torch.Tensor) -> None:
    """One training step without the optimizer update: forward, next-token loss, backward."""
    logits = model(ids)  # [B, T, V]
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    loss.backward()
    model.zero_grad(set_to_none=True)


def cache_summary(cache) -> dict:
    """Measured bytes and the slot / token counts the cache reports."""
    stats = cache.stats()
    return {"nbytes": int(cache.nbytes), "tokens": int(stats["tokens"]),
            "slots": _plain(stats["slots"]), "mass": _plain(stats["mass"])}


def _plain(x):
    """Per-layer counts as JSON-ready numbers (a layer may report a tensor or per-sequence list)."""
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x
