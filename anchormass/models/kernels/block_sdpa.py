"""Exact docs/method.md §2.1/§2.2 attention by query chunks over SDPA with an additive bias (CPU and GPU).

Queries are processed in chunks of whole blocks (default ~256 positions: a chunk costs
chunk * (earlier slots + chunk) scores, and ~T/8 slots are visible on average, so small
chunks waste little on masked keys while the Python loop stays at T/256 calls). A chunk's keys
are the sinks, the slots of every block before the chunk's last block, and the chunk's own
raw tokens; a per-chunk bias holds log(mass) for visible slots and -inf for invisible keys.
Memory per chunk is O(chunk * (sinks + slots + chunk)), never T x T. Every query sees at
least itself, so no softmax row is fully masked.

The log(mass) term is added in fp32 whatever the input dtype: in bf16 it would be rounded to
8 significant bits before it reaches the softmax, which FlexAttention's fp32 score_mod is not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from anchormass.models.config import ModelConfig
from anchormass.models.kernels.layout import block_of, global_slots

NEG_INF = float("-inf")


@dataclass
class BlockSdpaKernel:
    """The block-wise SDPA kernel of one attention module (see kernels/__init__.py)."""

    cfg: ModelConfig
    query_chunk: int = 256  # queries per SDPA call (see the module docstring)
    recompute_above: int = 4096  # training beyond this length: rebuild each chunk's keys/bias in backward

    def local_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return local_attention(q, k, v, self.cfg.window, chunk=self.query_chunk)

    def global_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         scorer: torch.Tensor | None = None) -> torch.Tensor:
        return global_attention(q, k, v, self.cfg, chunk=self.query_chunk,
                                recompute=q.shape[2] > self.recompute_above, scorer=scorer)


def chunk_bounds(t: int, n_sinks: int, block_size: int, chunk: int) -> list[tuple[int, int]]:
    """Query chunks [start, end): the first also holds the sink positions; boundaries sit on blocks."""
    step = max(block_size, chunk // block_size * block_size)
    bounds, start = [], 0
    end = min(t, n_sinks + step)
    while start < t:
        bounds.append((start, end))
        start, end = end, min(t, end + step)
    return bounds


def _span(parts, bounds: list[tuple[int, int]], a: int, b: int) -> torch.Tensor:
    """Positions a..b-1 (dim 2) of a tensor that was split into `parts` covering `bounds`.

    Built from the parts, so backward writes into each part's (chunk-sized) gradient and the one
    split joins them: slicing the full-length tensor per chunk would zero-fill a full-size gradient
    per chunk instead.
    """
    pieces = [p if a <= s and e <= b else p.narrow(2, max(a, s) - s, min(b, e) - max(a, s))
              for p, (s, e) in zip(parts, bounds) if s < b and e > a]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=2)


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                    chunk: int = 256) -> torch.Tensor:
    """Sliding window (docs/method.md §2.1): query t sees keys max(0, t-window+1)..t. q [B, H, T, D],
    k, v [B, H_kv, T, D] (H_kv divides H: grouped-query attention)."""
    t = q.shape[2]
    gqa = is_gqa(q, k)
    if t <= chunk and t <= window:  # the window covers everything: plain causal attention
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    bounds = [(start, min(t, start + chunk)) for start in range(0, t, chunk)]
    sizes = [e - a for a, e in bounds]
    q_parts, k_parts, v_parts = (x.split(sizes, dim=2) for x in (q, k, v))  # [B, H, chunk, D] each
    masks: dict[tuple[int, int], torch.Tensor] = {}  # interior chunks share one band: saved once
    outs = []
    for q_c, (start, end) in zip(q_parts, bounds):
        k0 = max(0, start - window + 1)
        key = (end - start, start - k0)
        if key not in masks:
            qp = torch.arange(start, end, device=q.device)[:, None]
            kp = torch.arange(k0, end, device=q.device)[None, :]
            visible = (kp <= qp) & (kp > qp - window)  # [Tq, Tk]
            masks[key] = torch.zeros(visible.shape, dtype=q.dtype, device=q.device).masked_fill(~visible, NEG_INF)
        outs.append(F.scaled_dot_product_attention(q_c, _span(k_parts, bounds, k0, end),
                                                   _span(v_parts, bounds, k0, end), attn_mask=masks[key],
                                                   enable_gqa=gqa))
    return torch.cat(outs, dim=2)


def _slot_counts(bounds: list[tuple[int, int]], n_sinks: int, block_size: int, slots_per_block: int) -> list[int]:
    """Slots each query chunk sees: those of every block before the chunk's last block (no device sync)."""
    return [max(0, (end - 1 - n_sinks) // block_size) * slots_per_block for _, end in bounds]


def global_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: ModelConfig,
                     chunk: int = 256, recompute: bool = False, scorer: torch.Tensor | None = None) -> torch.Tensor:
    """docs/method.md §2.2 for every position. q [B, Hg, T, D], k, v [B, Hg_kv, T, D] post-RoPE
    global heads (Hg_kv divides Hg; stage 1 compresses the KV heads); scorer: the layer's learned
    outlier scorer [Hg_kv, D] or None (the rule).

    Every input is split once into the pieces the chunks use (sinks, per-chunk raw keys, the slots
    that become visible at each chunk), and each chunk concatenates its pieces: backward then adds
    chunk-sized gradients into piece gradients and one split per tensor joins them, instead of a
    zeroed full-size gradient per chunk slice.

    recompute=True: each chunk's keys and bias are rebuilt in backward instead of saved. Saved,
    they add up to O(T * slots) = O(T^2 / 8) floats (~1.1 GiB per layer of anchormass_mini at
    32K); rebuilt, training keeps only each chunk's output, for one extra forward of this attention.
    """
    t = q.shape[2]
    n_sink, slot_k, slot_v, slot_lm = global_slots(k, v, cfg, scorer)
    bounds = chunk_bounds(t, cfg.n_sinks, cfg.block_size, chunk)
    raw_sizes = [max(0, end - max(start, n_sink)) for start, end in bounds]  # raw (non-sink) keys per chunk
    n_sl = _slot_counts(bounds, cfg.n_sinks, cfg.block_size, cfg.slots_per_block)
    new_slots = [b - a for a, b in zip([0] + n_sl, n_sl + [slot_k.shape[2]])]  # last: slots no chunk sees
    q_parts = q.split([end - start for start, end in bounds], dim=2)
    k_sink, *k_raw = k.split([n_sink] + raw_sizes, dim=2)
    v_sink, *v_raw = v.split([n_sink] + raw_sizes, dim=2)
    sk_parts, sv_parts = slot_k.split(new_slots, dim=2), slot_v.split(new_slots, dim=2)
    outs = []
    for i, (start, end) in enumerate(bounds):
        args = (q_parts[i], k_sink, v_sink, sk_parts[:i + 1], sv_parts[:i + 1], k_raw[i], v_raw[i],
                slot_lm[:, :n_sl[i]], start, end, cfg)
        if recompute and torch.is_grad_enabled():
            outs.append(checkpoint(_global_chunk, *args, use_reentrant=False))
        else:
            outs.append(_global_chunk(*args))
    return torch.cat(outs, dim=2)


def _global_chunk(q_c, k_sink, v_sink, slot_k, slot_v, k_raw, v_raw, slot_lm, start: int, end: int,
                  cfg: ModelConfig) -> torch.Tensor:
    """Queries start..end-1 (q_c [B, Hg, Tq, D]) against sinks + earlier slots + the chunk's raw keys.

    slot_k / slot_v: the slot pieces visible to this chunk, in order; slot_lm [B, n_sl]: their log-mass.
    """
    b, dev = q_c.shape[0], q_c.device
    s, c, spb = cfg.n_sinks, cfg.block_size, cfg.slots_per_block
    n_sink, n_sl, n_raw = k_sink.shape[2], slot_lm.shape[1], k_raw.shape[2]
    qpos = torch.arange(start, end, device=dev)  # [Tq]
    qblk = block_of(qpos, s, c)
    rpos = torch.arange(end - n_raw, end, device=dev)  # raw (non-sink) keys of this chunk
    sink_ok = torch.arange(n_sink, device=dev)[None, :] <= qpos[:, None]  # [Tq, n_sink]
    slot_ok = (torch.arange(n_sl, device=dev) // spb)[None, :] < qblk[:, None]  # [Tq, n_sl]
    raw_ok = (block_of(rpos, s, c)[None, :] == qblk[:, None]) & (rpos[None, :] <= qpos[:, None])  # [Tq, Tr]
    zero = torch.zeros((), device=dev)
    bias = torch.cat([
        torch.where(sink_ok, zero, NEG_INF).expand(b, -1, -1),
        torch.where(slot_ok[None], slot_lm[:, None], NEG_INF),
        torch.where(raw_ok, zero, NEG_INF).expand(b, -1, -1),
    ], dim=-1)[:, None]  # [B, 1, Tq, Kn], fp32 (slot_lm is)
    keys = torch.cat([k_sink, *slot_k, k_raw], dim=2)  # [B, Hg, Kn, D]
    vals = torch.cat([v_sink, *slot_v, v_raw], dim=2)
    return sdpa_fp32_bias(q_c, keys, vals, bias)


def is_gqa(q: torch.Tensor, k: torch.Tensor) -> bool:
    """Fewer key than query heads: SDPA shares KV head j with query heads j*g .. j*g + g - 1."""
    return q.shape[1] != k.shape[1]


def sdpa_fp32_bias(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """SDPA whose additive bias (log(mass), -inf) reaches the scores unrounded; k, v may have
    fewer heads than q (grouped-query attention).

    fp32 and fp64 inputs run as they are. Lower-precision inputs are upcast, so scores, bias and
    softmax are all fp32 (the precision FlexAttention computes scores and its score_mod in), and
    the output is cast back. Autocast is off here: it would cast the bias to bf16.
    """
    dt = q.dtype
    work = dt if dt in (torch.float32, torch.float64) else torch.float32
    with torch.autocast(q.device.type, enabled=False):
        out = F.scaled_dot_product_attention(q.to(work), k.to(work), v.to(work), attn_mask=bias.to(work),
                                             enable_gqa=is_gqa(q, k))
    return out.to(dt)
