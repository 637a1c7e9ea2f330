"""SPEC 2.1/2.2 attention with compiled FlexAttention: a block mask for visibility, a score_mod for log(mass).

Global keys are laid out as [sinks | every slot | raw tokens S..T-1]; the block mask encodes
"sink at or before t", "slot of a block before t's block" and "raw token of t's block at or
before t" by index arithmetic only, so it does not depend on the batch and is built once per
(length, layout) and shared by all layers. Mass-0 slots are removed by the score_mod (-inf),
which adds log(mass) in fp32. Same numbers as `block_sdpa`; GPU forward + backward, CPU
forward only (torch 2.13 has no CPU FlexAttention backward).
"""

from __future__ import annotations

import functools

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from anchormass.models.config import ModelConfig
from anchormass.models.kernels.layout import global_slots

# One compiled graph per sequence length. Evaluation runs many lengths; past the recompile
# limit dynamo would fall back to eager flex, which materialises the whole score matrix.
torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
_flex = torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=32)
def _local_mask(t: int, window: int, device: str):
    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & (q_idx - kv_idx < window)

    return create_block_mask(mask_mod, None, None, t, t, device=device, _compile=True)


@functools.lru_cache(maxsize=32)
def _global_mask(t: int, n_sink: int, n_slots: int, n_sinks: int, block_size: int, slots_per_block: int,
                 device: str):
    def mask_mod(b, h, q_idx, kv_idx):
        q_blk = torch.where(q_idx >= n_sinks, (q_idx - n_sinks) // block_size, -1)
        is_sink = kv_idx < n_sink
        is_raw = kv_idx >= n_sink + n_slots
        is_slot = ~is_sink & ~is_raw
        slot_blk = (kv_idx - n_sink) // slots_per_block
        raw_pos = kv_idx - n_slots
        raw_blk = (raw_pos - n_sinks) // block_size
        return ((is_sink & (kv_idx <= q_idx))
                | (is_slot & (slot_blk < q_blk))
                | (is_raw & (raw_blk == q_blk) & (raw_pos <= q_idx)))

    return create_block_mask(mask_mod, None, None, t, t + n_slots, device=device, _compile=True)


def local_attention(q, k, v, window: int, chunk: int | None = None) -> torch.Tensor:
    """Sliding window of `window` keys (query included). q, k, v: [B, H, T, D].

    `chunk` (and `recompute` below) exist for signature parity with block_sdpa; flex needs neither.
    """
    return _flex(q, k, v, block_mask=_local_mask(q.shape[2], window, str(q.device)))


def global_attention(q, k, v, cfg: ModelConfig, chunk: int | None = None, recompute: bool = False) -> torch.Tensor:
    """SPEC 2.2 for every position. q, k, v: [B, Hg, T, D] post-RoPE."""
    b, _, t, _ = q.shape
    n_sink, slot_k, slot_v, slot_lm = global_slots(k, v, cfg)
    n_slots = slot_lm.shape[1]
    keys = torch.cat([k[:, :, :n_sink], slot_k, k[:, :, n_sink:]], dim=2)  # [B, Hg, T + n_slots, D]
    vals = torch.cat([v[:, :, :n_sink], slot_v, v[:, :, n_sink:]], dim=2)
    bias = torch.zeros(b, t + n_slots, device=q.device, dtype=torch.float32)
    bias[:, n_sink:n_sink + n_slots] = slot_lm  # [B, Kn]: log(mass) on slots, 0 on raw keys

    def score_mod(score, b_idx, h_idx, q_idx, kv_idx):
        return score + bias[b_idx, kv_idx]

    mask = _global_mask(t, n_sink, n_slots, cfg.n_sinks, cfg.block_size, cfg.slots_per_block, str(q.device))
    return _flex(q, keys, vals, score_mod=score_mod, block_mask=mask)
