"""Inference engine: chunked prefill through a session cache, then a greedy / sampling decode loop.

Works with both models and every cache policy: it only uses `model(ids, cache=cache)`,
`model.forward_hidden`, `model.lm_head` and `anchormass.cache.new_cache` (docs/method.md §7).
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

from anchormass.cache import new_cache
from anchormass.errors import ConfigError, DataError
from anchormass.models.rope import ntk_base


@torch.no_grad()
def prefill(model, ids: torch.Tensor, cache, chunk_size: int | None = None) -> torch.Tensor:
    """Feed the prompt `ids` [B, P] through `cache` in chunks; return the last position's logits [B, V].

    The session's RoPE base is fixed here from the whole prompt length P (docs/method.md §1), before the
    first chunk, so that every chunk and every later decode step uses the same base. Only the
    last position goes through the LM head.
    """
    cfg = model.cfg
    if ids.dim() != 2 or ids.shape[1] == 0:
        raise DataError(f"prompt must be a non-empty [batch, length] tensor, got shape {tuple(ids.shape)}")
    chunk = cfg.prefill_chunk if chunk_size is None else chunk_size
    if not isinstance(chunk, int) or chunk < 1:
        raise ConfigError(f"prefill chunk size must be a positive integer, got {chunk!r}")
    if cache.rope_base is None:
        cache.rope_base = ntk_base(cfg.rope_theta, ids.shape[1], cfg.original_max_len, cfg.head_dim)
    for start in range(0, ids.shape[1], chunk):
        hidden = model.forward_hidden(ids[:, start:start + chunk], cache=cache)  # [B, T, d]
    cache.end_prefill()
    return model.lm_head(hidden[:, -1])  # [B, V]


def sample_next(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """logits [B, V] -> next ids [B]: argmax at temperature 0, else a sample from the filtered softmax."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # [B, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already hold top_p; the first always stays.
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def _check_sampling(max_new_tokens, temperature, top_k, top_p) -> None:
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if temperature < 0:
        raise ConfigError(f"temperature must be >= 0, got {temperature}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ConfigError(f"top_k must be a positive integer, got {top_k!r}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")


def inference_autocast(model) -> contextlib.AbstractContextManager:
    """bf16 autocast for a model on a GPU (its cache then holds bf16), nothing on CPU (fp32)."""
    device = next(model.parameters()).device
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def decode_threads(model, n_threads: int | None = 1):
    """Run the block with at most `n_threads` intra-op threads when `model` is on the CPU.

    Why: a decode step is a chain of tiny ops on [B, d] rows, each far shorter than a scheduler
    time slice. Split over several OpenMP threads, every op ends in a barrier that waits for all
    of them; on a CPU shared with other processes a worker is often descheduled, and then each
    op waits a whole time slice, so one thread is faster and its speed does not depend on the
    machine's load. `None` keeps torch's setting. The previous count is restored on exit.
    """
    if n_threads is not None and (not isinstance(n_threads, int) or n_threads < 1):
        raise ConfigError(f"decode threads must be a positive integer or None, got {n_threads!r}")
    device = next(model.parameters()).device
    before = torch.get_num_threads()
    if n_threads is None or device.type != "cpu" or n_threads >= before:
        yield
        return
    torch.set_num_threads(n_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@torch.no_grad()
def generate(model, prompt_ids: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, eos_id: int | None = None,
             policy=None, budget=None, chunk_size: int | None = None,
             callback: Callable[[int, torch.Tensor], None] | None = None,
             generator: torch.Generator | None = None, threads: int | None = 1) -> torch.Tensor:
    """Continue each prompt of `prompt_ids` [B, P]; returns the new ids [B, n], n <= max_new_tokens.

    A sequence that emitted `eos_id` is finished: its later positions are padded with `eos_id`,
    and decoding stops when every sequence is finished. `callback(step, ids [B])` sees each
    step's tokens as they come (streaming). `policy` / `budget` go to `anchormass.cache.new_cache`.
    `threads`: intra-op threads for the decode loop on CPU (see `decode_threads`; None: torch's).
    """
    _check_sampling(max_new_tokens, temperature, top_k, top_p)
    if prompt_ids.dim() == 1:
        prompt_ids = prompt_ids[None]
    was_training = model.training
    model.eval()
    try:
        with inference_autocast(model):
            cache = new_cache(model, batch_size=prompt_ids.shape[0], policy=policy, budget=budget)
            logits = prefill(model, prompt_ids, cache, chunk_size).float()  # [B, V]
            with decode_threads(model, threads):
                out = decode(model, cache, logits, max_new_tokens, temperature, top_k, top_p, eos_id,
                             callback=callback, generator=generator)
    finally:
        model.train(was_training)
    return out


@torch.no_grad()
def decode(model, cache, logits: torch.Tensor, max_new_tokens: int, temperature: float = 0.0,
           top_k: int | None = None, top_p: float | None = None, eos_id: int | None = None,
           callback: Callable[[int, torch.Tensor], None] | None = None,
           generator: torch.Generator | None = None, vocab_limit: int | None = None) -> torch.Tensor:
    """The one decode loop: from the last prompt logits [B, V], sample, stream and feed back one token
    per step through `cache`; returns the new ids [B, n], n <= max_new_tokens.

    `callback(step, ids [B])` runs after step `step`'s token is chosen and before it is fed, so the
    cache then holds the prompt plus `step` decoded tokens: the hook for streaming and for per-token
    measurement (e.g. `cache.nbytes`). `vocab_limit`: only ids below it are candidates (a tokenizer
    smaller than the model's vocabulary).
    """
    _check_sampling(max_new_tokens, temperature, top_k, top_p)
    finished = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    out = []
    for step in range(max_new_tokens):
        nxt = sample_next(logits[:, :vocab_limit], temperature, top_k, top_p, generator)  # [B]
        if eos_id is not None:
            nxt = nxt.masked_fill(finished, eos_id)
            finished |= nxt == eos_id
        out.append(nxt)
        if callback is not None:
            callback(step, nxt)
        # Without eos_id nothing finishes: skip the check (a device sync per token on GPU).
        if step + 1 == max_new_tokens or (eos_id is not None and bool(finished.all())):
            break
        logits = model(nxt[:, None], cache=cache)[:, -1].float()
    if not out:
        return logits.new_zeros(logits.shape[0], 0, dtype=torch.long)
    return torch.stack(out, dim=1)
