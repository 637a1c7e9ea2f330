"""The measured sessions, written against the model/cache contract only (docs/method.md §7:
`model(ids)`, `anchormass.cache.new_cache`, `model(chunk, cache=cache)`, `generate.prefill`,
`generate.decode`, `cache.nbytes`, `cache.stats()`), so they run unchanged on both architectures."""

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
    """Greedy decoding of n_tokens steps through the cache, starting by feeding `token` [B, 1];
    returns the next token [B, 1] (chosen, not yet fed), so windows can be chained.

    Feeding `token` is the first of the n_tokens model steps; `generate.decode` (the one decode
    loop) then picks n_tokens ids and feeds all but the last, n_tokens - 1 more steps.
    """
    if n_tokens == 0:
        return token
    logits = model(token, cache=cache)[:, -1].float()  # [B, V]
    return generate.decode(model, cache, logits, n_tokens)[:, -1:]


def train_step(model, ids: torch.Tensor, bf16_autocast: bool = False) -> float:
    """One training step without the optimizer update: forward (under bf16 autocast on the ids'
    device if asked), next-token loss in fp32, backward. Returns the loss."""
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=bf16_autocast):
        logits = model(ids)  # [B, T, V]
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    loss.backward()
    model.zero_grad(set_to_none=True)
    return float(loss.detach())


def cache_summary(cache) -> dict:
    """Measured bytes and the slot / mass counts the cache reports ([layer][sequence] lists)."""
    stats = cache.stats()
    return {"nbytes": int(cache.nbytes), "tokens": int(stats["tokens"]), "slots": stats["slots"],
            "mass": stats["mass"]}
