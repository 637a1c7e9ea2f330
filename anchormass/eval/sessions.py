"""One inference session (prefill a prompt, then feed or decode a continuation) with its KV
bytes measured: the building block of the equal-bytes baselines, the SnapKV hit rate and the
cached perplexity mode.

Two figures per session (docs/method.md §6):
- stored bytes: the keys, values and masses the cache keeps (`cache.stored_nbytes`), at the end
  of the prefill and after the last token fed;
- allocated bytes: what its buffers hold (`cache.nbytes`), at the end of the prefill and the
  largest value after it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from anchormass.cache import new_cache
from anchormass.eval.common import gather_logprobs
from anchormass.eval.suite import EvalContext
from anchormass.inference import generate
from anchormass.models.rope import ntk_base


@dataclass
class KVBytes:
    """The session's KV bytes (batch summed): stored / allocated at the end of the prefill,
    stored after the last token, the largest allocation after the prefill."""

    stored_prefill: int
    allocated_prefill: int
    stored_end: int = 0
    allocated_peak: int = 0

    @classmethod
    def after_prefill(cls, cache) -> "KVBytes":
        stored, allocated = cache.stored_nbytes, cache.nbytes
        return cls(stored, allocated, stored, allocated)

    def step(self, cache) -> None:
        """Call after each token (or chunk) fed after the prefill."""
        self.stored_end = cache.stored_nbytes
        self.allocated_peak = max(self.allocated_peak, cache.nbytes)

    def as_dict(self) -> dict:
        return asdict(self)


def new_session(model, batch_size: int, total_len: int, policy=None, budget=None):
    """A cache whose RoPE base is fixed from `total_len` (the prompt, or the whole scored input)."""
    cfg = model.cfg
    cache = new_cache(model, batch_size=batch_size, policy=policy, budget=budget)
    cache.rope_base = ntk_base(cfg.rope_theta, total_len, cfg.original_max_len, cfg.head_dim)
    return cache


def session_logprobs(model, ids: torch.Tensor, start: int, chunk: int, score_chunk: int,
                     policy=None, budget=None) -> tuple[torch.Tensor, KVBytes]:
    """log p(ids[t+1] | ids[:t+1]) for t = start .. T-2, [B, T-1-start].

    The prompt ids[:, :start+1] is prefilled in `chunk`s and ends the prefill (a KV policy such
    as SnapKV compresses here); the rest is teacher-forced `score_chunk` tokens at a time through
    the same cache. RoPE base from the whole input length T."""
    def logprobs(logits, s):  # rows s .. s+n-1 predict ids[s+1 .. s+n]
        return gather_logprobs(logits, ids[:, s + 1:s + 1 + logits.shape[1]])

    return session_scores(model, ids, start, chunk, score_chunk, logprobs, policy, budget)


def session_argmax(model, ids: torch.Tensor, start: int, chunk: int, score_chunk: int,
                   policy=None, budget=None) -> tuple[torch.Tensor, KVBytes]:
    """The greedy next token after ids[:t+1] for t = start .. T-2, [B, T-1-start], over the whole
    vocabulary; the session as in `session_logprobs` (teacher-forced after the prefill)."""
    return session_scores(model, ids, start, chunk, score_chunk, lambda logits, s: logits.argmax(-1),
                          policy, budget)


@torch.no_grad()
def session_scores(model, ids: torch.Tensor, start: int, chunk: int, score_chunk: int, score,
                   policy=None, budget=None) -> tuple[torch.Tensor, KVBytes]:
    """score(logits [B, n, V], s) -> [B, n] for positions s .. s+n-1, concatenated over
    t = start .. T-2; see `session_logprobs` for the session."""
    total = ids.shape[1]
    cache = new_session(model, ids.shape[0], total, policy, budget)
    last = generate.prefill(model, ids[:, : start + 1], cache, chunk).float()  # row `start`
    out = [score(last[:, None], start)]
    meter = KVBytes.after_prefill(cache)
    for s in range(start + 1, total - 1, score_chunk):
        e = min(total - 1, s + score_chunk)
        out.append(score(model(ids[:, s:e], cache=cache), s))  # rows s .. e-1
        meter.step(cache)
    return torch.cat(out, dim=1), meter


@torch.no_grad()
def session_decode(model, ids: torch.Tensor, new_tokens: int, chunk: int, policy=None, budget=None,
                   vocab_limit: int | None = None) -> tuple[torch.Tensor, KVBytes]:
    """Greedy continuation [B, new_tokens] of the prompt `ids` [B, P] through the one decode loop,
    with the cache measured after every token fed."""
    cache = new_session(model, ids.shape[0], ids.shape[1], policy, budget)
    logits = generate.prefill(model, ids, cache, chunk).float()
    meter = KVBytes.after_prefill(cache)
    # The hook runs before step `step`'s token is fed: the cache then holds `step` decoded tokens.
    out = generate.decode(model, cache, logits, new_tokens, vocab_limit=vocab_limit,
                          callback=lambda step, _ids: meter.step(cache) if step else None)
    meter.step(cache)
    return out, meter


@torch.no_grad()
def standard_bytes_per_token(model) -> int:
    """Stored K+V bytes one token costs in the Standard model's cache (all layers), measured."""
    from anchormass.cache.standard_cache import StandardCache

    p = next(model.parameters())
    n = 8
    cache = StandardCache(model.cfg, 1, device=p.device, dtype=p.dtype, decode_reserve=0)
    generate.prefill(model, torch.zeros(1, n, dtype=torch.long, device=p.device), cache, n)
    return cache.stored_nbytes // n


def needs_standard(ctx: EvalContext, what: str) -> str | None:
    """Suite.applies for suites that study the Standard model's cache."""
    if any(m.arch == "standard" for m in ctx.models):
        return None
    return f"{what} on a Standard model (arch=standard); none given"
