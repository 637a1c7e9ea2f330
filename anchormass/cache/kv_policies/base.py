"""What a Standard-model KV policy is (docs/method.md §3), and the two pieces of maths they share.

A policy (anchormass/cache/policy.py) is a dataclass whose fields are its hyperparameters plus
`budget` (tokens kept per head), bound up front. One instance serves every layer of a cache: the per-layer state
(scores, observation queries) lives in the `StandardLayerCache` it is handed, so policies stay stateless and can be
shared or reused. The layer calls three hooks:

- `on_attend(layer, q)`  after the chunk's k/v were appended (the chunk = the last T stored slots);
- `after_forward(layer)` once per model forward (eviction policies act here);
- `end_prefill(layer)`   once when the prompt is done (SnapKV compresses here).

Every policy selects per head and per sequence; selections always keep the same number of
tokens in every head, so the cache stays a dense [B, H, n, D] tensor.
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

    def after_forward(self, layer: "StandardLayerCache") -> None:
        pass

    def end_prefill(self, layer: "StandardLayerCache") -> None:
        pass


def attention_probs(q: torch.Tensor, k: torch.Tensor, first_query_slot: int) -> torch.Tensor:
    """fp32 causal attention probabilities of queries over stored keys.

    q: [B, H, Tq, D]; k: [B, H, L, D]. Query i sits at storage slot `first_query_slot + i` and
    sees slots 0 .. first_query_slot + i (earlier slots always hold earlier positions).
    Returns [B, H, Tq, L].
    """
    tq, length = q.shape[2], k.shape[2]
    logits = torch.matmul(q.float(), k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])  # [B, H, Tq, L]
    if first_query_slot < length - 1:  # some key lies after some query (else, e.g. decoding: all visible)
        rows = torch.arange(tq, device=q.device).unsqueeze(1) + first_query_slot
        cols = torch.arange(length, device=q.device).unsqueeze(0)
        logits = logits.masked_fill(cols > rows, float("-inf"))
    return torch.softmax(logits, dim=-1)


def top_positions(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores along the last dim, returned in ascending (chronological)
    order. Ties go to the earlier index, so the choice is deterministic even after max-pooling,
    which copies one value onto its neighbours. scores: [..., N] -> [..., k] (int64)."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
    return torch.sort(order, dim=-1).values
