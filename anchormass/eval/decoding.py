"""Greedy continuation of a batch of equal-length prompts through the inference cache."""

from __future__ import annotations

import torch


def greedy(model, ids: torch.Tensor, max_new_tokens: int, policy=None, budget=None,
           chunk: int | None = None) -> torch.Tensor:
    """ids [B, P] -> the B x max_new_tokens greedily generated ids (the prompt not included)."""
    from anchormass.models.generate import generate

    out = generate(model, ids, max_new_tokens, temperature=0, policy=policy, budget=budget,
                   chunk_size=chunk or model.cfg.prefill_chunk)
    out = out if torch.is_tensor(out) else torch.as_tensor(out)
    return out[:, -max_new_tokens:]
