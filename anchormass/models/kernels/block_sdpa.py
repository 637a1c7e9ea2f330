"""Exact SPEC 2.1/2.2 attention by query chunks over SDPA with an additive bias (CPU and GPU).

Queries are processed in chunks of whole blocks (default ~256 positions: a chunk costs
chunk * (earlier slots + chunk) scores, and ~T/8 slots are visible on average, so small
chunks waste little on masked keys while the Python loop stays at T/256 calls). A chunk's keys
are the sinks, the slots of every block before the chunk's last block, and the chunk's own
raw tokens; a per-chunk bias holds log(mass) for visible slots and -inf for invisible keys.
Memory per chunk is O(chunk * (sinks + slots + chunk)), never T x T. Every query sees at
least itself, so no softmax row is fully masked.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from anchormass.models.config import ModelConfig
from anchormass.models.kernels.layout import block_of, global_slots

NEG_INF = float("-inf")


def chunk_bounds(t: int, n_sinks: int, block_size: int, chunk: int) -> list[tuple[int, int]]:
    """Query chunks [start, end): the first also holds the sink positions; boundaries sit on blocks."""
    step = max(block_size, chunk // block_size * block_size)
    bounds, start = [], 0
    end = min(t, n_sinks + step)
    while start < t:
        bounds.append((start, end))
        start, end = end, min(t, end + step)
    return bounds


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                    chunk: int = 256) -> torch.Tensor:
    """Sliding window (SPEC 2.1): query t sees keys max(0, t-window+1)..t. q, k, v: [B, H, T, D]."""
    t = q.shape[2]
    if t <= chunk and t <= window:  # the window covers everything: plain causal attention
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    masks: dict[tuple[int, int], torch.Tensor] = {}  # interior chunks share one band: saved once
    outs = []
    for start in range(0, t, chunk):
        end = min(t, start + chunk)
        k0 = max(0, start - window + 1)
        key = (end - start, start - k0)
        if key not in masks:
            qp = torch.arange(start, end, device=q.device)[:, None]
            kp = torch.arange(k0, end, device=q.device)[None, :]
            visible = (kp <= qp) & (kp > qp - window)  # [Tq, Tk]
            masks[key] = torch.zeros(visible.shape, dtype=q.dtype, device=q.device).masked_fill(~visible, NEG_INF)
        outs.append(F.scaled_dot_product_attention(q[:, :, start:end], k[:, :, k0:end], v[:, :, k0:end],
                                                   attn_mask=masks[key]))
    return torch.cat(outs, dim=2)


def global_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: ModelConfig,
                     chunk: int = 256, recompute: bool = False) -> torch.Tensor:
    """SPEC 2.2 for every position. q, k, v: [B, Hg, T, D] post-RoPE global heads.

    recompute=True: each chunk's keys and bias are rebuilt in backward instead of saved. Saved,
    they add up to O(T * slots) = O(T^2 / 8) floats (~1.1 GiB per layer of anchormass_mini at
    32K); rebuilt, training keeps only each chunk's output, for one extra forward of this attention.
    """
    s, c = cfg.n_sinks, cfg.block_size
    n_sink, slot_k, slot_v, slot_lm = global_slots(k, v, cfg)
    outs = []
    for start, end in chunk_bounds(q.shape[2], s, c, chunk):
        args = (q[:, :, start:end], k, v, slot_k, slot_v, slot_lm, start, end, n_sink, cfg)
        if recompute and torch.is_grad_enabled():
            outs.append(checkpoint(_global_chunk, *args, use_reentrant=False))
        else:
            outs.append(_global_chunk(*args))
    return torch.cat(outs, dim=2)


def _global_chunk(q_c, k, v, slot_k, slot_v, slot_lm, start: int, end: int, n_sink: int,
                  cfg: ModelConfig) -> torch.Tensor:
    """Queries start..end-1 (q_c [B, Hg, Tq, D]) against sinks + earlier slots + the chunk's raw keys."""
    b, dev = q_c.shape[0], q_c.device
    s, c, spb = cfg.n_sinks, cfg.block_size, cfg.slots_per_block
    qpos = torch.arange(start, end, device=dev)  # [Tq]
    qblk = block_of(qpos, s, c)
    n_sl = max(0, (end - 1 - s) // c) * spb  # slots of blocks before the chunk's last block (no device sync)
    r0 = max(start, n_sink)
    rpos = torch.arange(r0, end, device=dev)  # raw (non-sink) keys of this chunk
    sink_ok = torch.arange(n_sink, device=dev)[None, :] <= qpos[:, None]  # [Tq, n_sink]
    slot_ok = (torch.arange(n_sl, device=dev) // spb)[None, :] < qblk[:, None]  # [Tq, n_sl]
    raw_ok = (block_of(rpos, s, c)[None, :] == qblk[:, None]) & (rpos[None, :] <= qpos[:, None])  # [Tq, Tr]
    zero = torch.zeros((), device=dev)
    bias = torch.cat([
        torch.where(sink_ok, zero, NEG_INF).expand(b, -1, -1),
        torch.where(slot_ok[None], slot_lm[:, None, :n_sl], NEG_INF),
        torch.where(raw_ok, zero, NEG_INF).expand(b, -1, -1),
    ], dim=-1)[:, None].to(q_c.dtype)  # [B, 1, Tq, Kn]
    keys = torch.cat([k[:, :, :n_sink], slot_k[:, :, :n_sl], k[:, :, r0:end]], dim=2)  # [B, Hg, Kn, D]
    vals = torch.cat([v[:, :, :n_sink], slot_v[:, :, :n_sl], v[:, :, r0:end]], dim=2)
    return F.scaled_dot_product_attention(q_c, keys, vals, attn_mask=bias)
