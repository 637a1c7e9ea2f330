"""Argmax predictions at query positions, shared by the suites that score recall per query
(mqar, recall_frontier): one parallel forward, or a cache session (prefill the
context under a policy / budget, then feed the queries one token at a time)."""

from __future__ import annotations

import torch

from anchormass.eval.sessions import session_argmax


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
