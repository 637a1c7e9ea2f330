"""What a Standard-model KV policy is (docs/method.md §3), and the two pieces of maths they share.

A policy (anchormass/cache/policy.py) is a dataclass whose fields are its hyperparameters plus
`budget` (tokens kept per KV head), bound up front. One instance serves every layer of a cache: the per-layer state
(scores, observation queries) lives in the `StandardLayerCache` it is handed, so policies stay stateless and can be
shared or reused. The layer calls three hooks:

- `on_attend(layer, q)`  after the chunk's k/v were appended (the chunk = the last T stored slots);
- `after_forward(layer)` once per model forward (eviction policies act here);
- `end_prefill(layer)`   once when the prompt is done (SnapKV compresses here).

Every policy selects per KV head and per sequence; selections always keep the same number of
tokens in every KV head, so the cache stays a dense [B, H_kv, n, D] tensor.

Grouped-query attention: attention is computed per query head, but a token is kept or dropped per
KV head, for the whole group of query heads sharing it. A policy that scores tokens from attention
gives a KV head the MEAN over its group's query heads of each query head's score (`kv_group_mean`),
the convention of NVIDIA's kvpress (its SnapKV and observed-attention presses average the group's
scores); docs/method.md §3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from anchormass.cache.policy import Policy

if TYPE_CHECKING:  # pragma: no cover
    from anchormass.cache.standard_cache import StandardLayerCache


@dataclass
class KVPolicy(Policy):
    name: ClassVar[str] = "base"
    budget_unit: ClassVar[str] = "tokens per head"
    # True when the cache never holds more than `budget` tokens between forwards (it then
    # needs capacity budget + one chunk, not geometric growth).
    bounded: ClassVar[bool] = False

    # ------------------------------------------------------------ hooks
    def on_attend(self, layer: "StandardLayerCache", q: torch.Tensor) -> None:
        pass

    def observation_key(self) -> tuple | None:
        """Policies with equal keys make the same per-slot records (aux) in `on_attend` from the same
        stored keys and queries, whatever their budgets: a shared prefill computes them once and
        copies them (shared_prefill.py). None: no such promise."""
        return None

    def after_forward(self, layer: "StandardLayerCache") -> None:
        pass

    def end_prefill(self, layer: "StandardLayerCache") -> None:
        pass


def attention_probs(q: torch.Tensor, k: torch.Tensor, first_query_slot: int) -> torch.Tensor:
    """fp32 causal attention probabilities of queries over stored keys, per query head.

    q: [B, H, Tq, D]; k: [B, H_kv, L, D], KV head j serving query heads j*g .. j*g + g - 1
    (g = H / H_kv). Query i sits at storage slot `first_query_slot + i` and sees slots
    0 .. first_query_slot + i (earlier slots always hold earlier positions). Returns [B, H, Tq, L].
    """
    return torch.softmax(_causal_logits(q, k, first_query_slot), dim=-1)


def _causal_logits(q: torch.Tensor, k: torch.Tensor, first_query_slot: int) -> torch.Tensor:
    """fp32 scaled logits [B, H, Tq, L] of `attention_probs`, keys after a query set to -inf in place."""
    b, h, tq, d = q.shape
    h_kv, length = k.shape[1], k.shape[2]
    # A group's query heads as one longer run of queries over their shared keys: no copy of k.
    grouped = q.float().reshape(b, h_kv, (h // h_kv) * tq, d)
    logits = torch.matmul(grouped, k.float().transpose(-2, -1)).view(b, h, tq, length)
    logits.div_(math.sqrt(d))  # as a division, bit for bit the scores SnapKV has always voted with
    if first_query_slot < length - 1:  # some key lies after some query (else, e.g. decoding: all visible)
        start = first_query_slot + 1  # only columns from here on are hidden from some query
        rows = torch.arange(tq, device=q.device).unsqueeze(1) + first_query_slot
        cols = torch.arange(start, length, device=q.device).unsqueeze(0)
        logits[..., start:].masked_fill_(cols > rows, float("-inf"))
    return logits


def attention_received(q: torch.Tensor, k: torch.Tensor, first_query_slot: int) -> torch.Tensor:
    """`attention_probs(q, k, first_query_slot).sum(dim=2)`: the fp32 attention each stored key receives
    from these queries, per query head, [B, H, L].

    The same sums, computed so that a long prefill reads its [B, H, Tq, L] block as few times as it
    can (H2O's scores at 16K are several times the block size of every cache on this CPU): logits,
    mask (only the keys that lie after some query: the last Tq columns at most), max, exp and each
    row's normaliser in place, then one batched matrix-vector product folds 1 / normaliser into the
    column sums instead of dividing the whole block."""
    logits = _causal_logits(q, k, first_query_slot)
    logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()
    inv = logits.sum(dim=-1).reciprocal_()  # [B, H, Tq]
    return torch.matmul(inv.unsqueeze(-2), logits).squeeze(-2)


def kv_group_mean(scores: torch.Tensor, h_kv: int) -> torch.Tensor:
    """Per-query-head scores [B, H, ...] -> per-KV-head [B, H_kv, ...]: the mean over each group's
    query heads (see the module docstring). The identity without GQA."""
    b, h = scores.shape[:2]
    if h == h_kv:
        return scores
    return scores.view(b, h_kv, h // h_kv, *scores.shape[2:]).mean(dim=2)


def top_positions(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores along the last dim, returned in ascending (chronological)
    order. Ties go to the earlier index, so the choice is deterministic even after max-pooling,
    which copies one value onto its neighbours. scores: [..., N] -> [..., k] (int64)."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
    return torch.sort(order, dim=-1).values
