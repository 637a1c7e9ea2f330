"""How the suites run a model and score it: log-likelihoods of targets, argmax predictions at
query positions, cache sessions with their KV bytes measured, the methods of the equal-memory
comparisons, OOM as a result and progress bars.

A session prefills a prompt, then feeds or decodes a continuation through one cache: the
building block of the equal-bytes baselines, the recall frontier, the SnapKV hit rate and the
cached perplexity and MQAR modes. Two figures per session (docs/method.md §6):
- stored bytes: the keys, values and masses the cache keeps (`cache.stored_nbytes`), at the end
  of the prefill and after the last token fed;
- allocated bytes: what its buffers hold (`cache.nbytes`), at the end of the prefill and the
  largest value after it.

A method (baselines, recall_frontier; docs/method.md §3, §6 f, h) is a model plus a cache
setting; a Standard KV policy gets the token budget matched to a stored-bytes target.
"""

from __future__ import annotations

import gc
import inspect
from dataclasses import asdict, dataclass
from typing import Iterable

import numpy as np
import torch
import torch.nn.functional as F

from anchormass.cache import new_cache
from anchormass.cache.kv_policies import KVPolicy
from anchormass.errors import ConfigError
from anchormass.eval.suite import EvalContext, EvalModel
from anchormass.inference import generate
from anchormass.models.rope import ntk_base

OOM = "OOM"


def is_oom(err: BaseException) -> bool:
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(err, (RuntimeError, MemoryError)) and (
        isinstance(err, MemoryError) or "out of memory" in str(err).lower()
        or "can't allocate memory" in str(err).lower())


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def progress(iterable: Iterable, enabled: bool, desc: str, total: int | None = None):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, leave=False, dynamic_ncols=True)


def target_logprobs(model, ids: torch.Tensor, start: int) -> torch.Tensor:
    """log p(ids[:, t+1] | ids[:, :t+1]) for t = start .. T-2: [B, T-1-start] (fp32).

    Only the scored positions go through the LM head, so long contexts do not materialise
    [B, T, vocab] logits.
    """
    if hasattr(model, "forward_hidden") and hasattr(model, "lm_head"):
        hidden = model.forward_hidden(ids)[:, start:-1]  # [B, n, d]
        logits = model.lm_head(hidden)
    else:
        logits = model(ids)[:, start:-1]  # [B, n, V]
    return gather_logprobs(logits, ids[:, start + 1:])


def anchor_nll(score, tokens, anchors: list[int], context: int, target_len: int, batch_size: int,
               device) -> list[float]:
    """Per anchor a, the mean NLL of tok[a+1 .. a+target_len-1] given the `context` tokens before a;
    score(ids [b, context + target_len], context) -> log-probs [b, target_len - 1]."""
    out: list[float] = []
    for i in range(0, len(anchors), batch_size):
        batch = [tokens[a - context:a + target_len] for a in anchors[i:i + batch_size]]
        ids = torch.as_tensor(np.stack(batch).astype(np.int64), device=device)
        out += (-score(ids, context).mean(dim=1)).tolist()
    return out


def padded_logits(model, ids: torch.Tensor, lengths: list[int], rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Logits [n, V] at positions (rows[i], cols[i]) of the right-padded batch ids [B, T] whose
    row b holds lengths[b] real tokens; only those positions go through the LM head.

    Our models get `lengths`, so each row is scored as it would be alone (its own RoPE base,
    docs/method.md §1) whatever else shares the batch. A model whose forward takes no `lengths`
    (a test double) gets the padded batch as it is."""
    if hasattr(model, "forward_hidden") and hasattr(model, "lm_head"):
        extra = {"lengths": lengths} if _takes_lengths(model.forward_hidden) else {}
        return model.lm_head(model.forward_hidden(ids, **extra)[rows, cols])
    extra = {"lengths": lengths} if _takes_lengths(model.forward) else {}
    return model(ids, **extra)[rows, cols]


def _takes_lengths(fn) -> bool:
    try:
        return "lengths" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logits [B, n, V], targets [B, n] -> log p(target) [B, n] in fp32."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return logp.gather(-1, targets[..., None]).squeeze(-1)


# Cache sessions and their KV bytes.

@dataclass
class KVBytes:
    """The session's KV bytes (batch summed): stored / allocated at the end of the prefill,
    stored after the last token, the largest allocation after the prefill."""

    stored_prefill: int
    allocated_prefill: int
    stored_end: int = 0
    allocated_peak: int = 0
    tokens_per_slot: float | None = None  # AnchorMass: tokens the global slots stand for per slot (None: no slots)

    @classmethod
    def after_prefill(cls, cache) -> "KVBytes":
        stored, allocated = cache.stored_nbytes, cache.nbytes
        return cls(stored, allocated, stored, allocated, tokens_per_slot(cache))

    def step(self, cache) -> None:
        """Call after each token (or chunk) fed after the prefill."""
        self.stored_end = cache.stored_nbytes
        self.allocated_peak = max(self.allocated_peak, cache.nbytes)
        self.tokens_per_slot = tokens_per_slot(cache)

    def as_dict(self) -> dict:
        return asdict(self)


def tokens_per_slot(cache) -> float | None:
    """A session's real merge ratio: tokens represented by the stored global slots over the slots
    (over layers and sequences). A cell's group size is not it: a group that keeps an outlier
    stores two slots. None for caches without slots (Standard) or before any slot exists."""
    layers = [layer for layer in cache.layers if hasattr(layer, "slot_tokens") and layer.counts is not None]
    slots = sum(int(layer.counts.sum()) for layer in layers)
    return sum(layer.slot_tokens() for layer in layers) / slots if slots else None


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
                   vocab_limit: int | None = None, forced: torch.Tensor | None = None) -> tuple[torch.Tensor, KVBytes]:
    """Greedy continuation [B, new_tokens] of the prompt `ids` [B, P] through the one decode loop,
    with the cache measured after every token fed. `forced` [B, P]: AnchorMass's oracle outliers
    (AnchorMassCache.force_outliers; evaluation only)."""
    cache = new_session(model, ids.shape[0], ids.shape[1], policy, budget)
    if forced is not None:
        cache.force_outliers(forced)
    logits = generate.prefill(model, ids, cache, chunk).float()
    meter = KVBytes.after_prefill(cache)
    # The hook runs before step `step`'s token is fed: the cache then holds `step` decoded tokens.
    out = generate.decode(model, cache, logits, new_tokens, vocab_limit=vocab_limit,
                          callback=lambda step, _ids: meter.step(cache) if step else None)
    meter.step(cache)
    return out, meter


@torch.no_grad()
def shared_session_decode(model, ids: torch.Tensor, new_tokens: int, chunk: int, settings: list[tuple],
                          vocab_limit: int | None = None) -> list[tuple[torch.Tensor, KVBytes]]:
    """`session_decode` for each (policy, budget) of `settings` on a Standard model, from one prefill of
    the prompt (cache/shared_prefill.py): the same answers and bytes, one forward instead of one each."""
    from anchormass.cache.shared_prefill import SharedPrefill, check_one_chunk

    check_one_chunk(ids.shape[1], chunk)
    caches = [new_session(model, ids.shape[0], ids.shape[1], policy, budget) for policy, budget in settings]
    logits = generate.prefill(model, ids, SharedPrefill(caches), chunk).float()
    results = []
    for cache in caches:
        meter = KVBytes.after_prefill(cache)
        out = generate.decode(model, cache, logits, new_tokens, vocab_limit=vocab_limit,
                              callback=lambda step, _ids, cache=cache, meter=meter: meter.step(cache) if step else None)
        meter.step(cache)
        results.append((out, meter))
    return results


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


# Argmax predictions at query positions (mqar, recall_frontier): one parallel forward, or a cache
# session (prefill the context under a policy / budget, then feed the queries one token at a time).

@torch.no_grad()
def parallel_predictions(model, ids: torch.Tensor, positions: list[int]) -> torch.Tensor:
    """Argmax next token at `positions` [n] of every row of ids [B, T]: [B, n]. Only those rows go
    through the LM head."""
    hidden = model.forward_hidden(ids)[:, positions]
    return model.lm_head(hidden).argmax(-1)


def cached_predictions(model, ids: torch.Tensor, context_len: int, positions: list[int], chunk,
                       policy=None, budget=None):
    """The same predictions through a cache session; (predictions [B, n], KVBytes)."""
    start = context_len - 1
    pred, meter = session_argmax(model, ids, start, model.cfg.prefill_chunk if chunk is None else int(chunk), 1,
                                 policy, budget)
    return pred[:, [p - start for p in positions]], meter


# Methods at equal memory (baselines, recall_frontier).

@dataclass
class Method:
    """One column of the comparison: a model plus a cache setting (and, on the recall frontier, the
    budget level it belongs to: "full" or the AnchorMass slot budget as text)."""

    name: str  # baselines: "anchormass" | "full" | a kv policy; frontier: "<arch>/<policy or full>"
    model: EvalModel
    policy: object = None
    budget: int | None = None
    level: str = "full"


def matched_budget(policy: KVPolicy, target_tokens: float, fed: int) -> tuple[int, str | None]:
    """The per-head token budget whose stored tokens after the last one fed equal `target_tokens`,
    and why it cannot be reached (None when it can): a bounded policy keeps its budget; an
    unbounded one (SnapKV) keeps its budget of the prompt plus every token fed after it."""
    want = round(target_tokens) - (0 if policy.bounded else fed)
    last = f"the matched budget would be {want} tokens"
    for budget in range(max(1, want), max(1, want) + 100_000):
        try:
            policy.bind(budget)
        except ConfigError as err:
            last = str(err)
            continue
        return budget, None if budget == want else f"budget raised to {budget}: {last}"
    raise ConfigError(f"baselines: no valid budget for {policy.name} near {want}")


def prefill_chunk(chunk, m: EvalModel) -> int:
    """The configured prefill chunk (`chunk`; unset or 0: the model's own prefill_chunk)."""
    return int(chunk) if chunk else m.config.prefill_chunk
