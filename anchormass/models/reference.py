"""Naive dense AnchorMass attention (docs/method.md §2.1 local heads, §2.2 global heads): the test oracle.

Builds the full visibility mask over [sinks | all slots | raw tokens] for every query, so it
is O(T * (T + slots)) in memory: for small T in tests only. The softmax runs in float64 so
the oracle's own rounding is negligible next to the 1e-5 / 1e-4 tolerances it checks.
"""

from __future__ import annotations

import math

import torch

from anchormass.models.attention_base import repeat_kv
from anchormass.models.compression import compress_blocks
from anchormass.models.config import ModelConfig


def local_visible(t_q: torch.Tensor, t_k: torch.Tensor, window: int) -> torch.Tensor:
    """[Tq, Tk] bool: key position j visible to query position t iff t - window < j <= t."""
    diff = t_q[:, None] - t_k[None, :]
    return (diff >= 0) & (diff < window)


def _dense_softmax_attend(q, k, v, bias) -> torch.Tensor:
    """q [B,H,Tq,D], k/v [B,H,Tk,D], bias broadcastable to [B,H,Tq,Tk] (-inf = invisible)."""
    scores = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias.double()
    return (scores.softmax(dim=-1) @ v.double()).to(q.dtype)


def reference_anchormass_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                   cfg: ModelConfig, scorer: torch.Tensor | None = None) -> torch.Tensor:
    """q [B, H, T, D], k, v [B, H_kv, T, D] post-RoPE, all heads (query heads [0, n_local) local,
    KV heads [0, n_local / q_per_kv)). Returns [B, H, T, D]. Stage 1 compresses the KV heads; the
    copies to query heads come after it. scorer: the layer's learned outlier scorer [Hg_kv, D]
    (outlier_scorer="learned"), else None."""
    b, h, t, d = q.shape
    nl, s, c = cfg.n_local_heads, cfg.n_sinks, cfg.block_size
    nkl, g = cfg.n_local_kv_heads, cfg.q_per_kv
    pos = torch.arange(t, device=q.device)
    out = torch.empty_like(q)

    if nl:
        vis = local_visible(pos, pos, cfg.window)
        bias = torch.zeros(t, t, dtype=torch.float64, device=q.device).masked_fill(~vis, -math.inf)
        out[:, :nl] = _dense_softmax_attend(q[:, :nl], repeat_kv(k[:, :nkl], g), repeat_kv(v[:, :nkl], g), bias)

    qg, kg, vg = q[:, nl:], k[:, nkl:], v[:, nkl:]
    n_sink = min(s, t)
    n_blocks = max(0, t - s) // c
    slot_k, slot_v, slot_mass = compress_blocks(kg[:, :, s:s + n_blocks * c], vg[:, :, s:s + n_blocks * c], cfg,
                                                  scorer=scorer)
    n_slots = slot_mass.shape[1]
    keys = torch.cat([kg[:, :, :n_sink], slot_k, kg[:, :, n_sink:]], dim=2)  # [B, Hg_kv, S + slots + (T-S), D]
    vals = torch.cat([vg[:, :, :n_sink], slot_v, vg[:, :, n_sink:]], dim=2)
    keys, vals = repeat_kv(keys, g), repeat_kv(vals, g)  # [B, Hg, ..., D]

    q_block = torch.where(pos >= s, (pos - s).div(c, rounding_mode="floor"), -1)  # [T]; -1 = sink region
    sink_vis = pos[:n_sink][None, :] <= pos[:, None]  # [T, n_sink]
    slot_block = torch.arange(n_slots, device=q.device) // cfg.slots_per_block  # [n_slots]
    slot_vis = slot_block[None, :] < q_block[:, None]  # [T, n_slots]: blocks entirely before t's block
    raw_pos = pos[n_sink:]
    raw_vis = (q_block[:, None] == q_block[n_sink:][None, :]) & (raw_pos[None, :] <= pos[:, None])  # tail
    vis = torch.cat([sink_vis, slot_vis, raw_vis], dim=1)  # [T, Kn]

    mass = torch.cat([torch.ones(b, n_sink, device=q.device), slot_mass.float(),
                      torch.ones(b, t - n_sink, device=q.device)], dim=1).double()  # [B, Kn]
    log_mass = mass.log() if cfg.mass_bias else torch.where(mass > 0, 0.0, -math.inf).double()
    bias = log_mass[:, None, None, :] + torch.where(vis, 0.0, -math.inf).double()[None, None]  # [B,1,T,Kn]
    out[:, nl:] = _dense_softmax_attend(qg, keys, vals, bias)
    return out
