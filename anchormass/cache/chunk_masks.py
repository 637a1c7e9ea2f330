"""What a prefill chunk's queries may see in the AnchorMass cache: its attention masks and biases.

Pure functions of positions (and, for the bias, the masses); `AnchorMassLayerCache` builds the
position-only masks once per forward, shares them across layers (`PrefillScratch`) and lays the
per-layer bias over its global buffer. Local heads follow docs/method.md §2.1, global heads §2.2.
"""

from __future__ import annotations

import math

import torch

from anchormass.models.kernels.layout import offset_in_block


def neg_inf_where_not(visible: torch.Tensor) -> torch.Tensor:
    """bool -> float bias: 0 where visible, -inf elsewhere."""
    return torch.zeros(visible.shape, device=visible.device).masked_fill(~visible, -math.inf)


def ring_positions(end: int, window: int, device) -> torch.Tensor:
    """[W] position held by each ring slot (slot = pos % W) once positions < end are written
    (negative = empty)."""
    return end - 1 - torch.remainder(end - 1 - torch.arange(window, device=device), window)


def local_chunk_visible(p0: int, pos: torch.Tensor, window: int) -> torch.Tensor:
    """[T, W + T] bool: the chunk at positions `pos` (starting at p0) over the keys ring + chunk.

    docs/method.md §2.1: position t sees t - W < j <= t; empty ring slots are never visible.
    """
    key_pos = torch.cat([ring_positions(p0, window, pos.device), pos])  # [W + T]
    diff = pos[:, None] - key_pos[None, :]  # [T, W + T]
    return (key_pos[None, :] >= 0) & (diff >= 0) & (diff < window)


def global_position_masks(p0: int, t: int, n_raw: int, n_new: int, n_sinks: int, block_size: int,
                          slots_per_block: int, dt: torch.dtype, device):
    """The position-only parts of `chunk_bias` for a t-token piece starting at p0 (0 / -inf, dtype dt).

    docs/method.md §2.2. Returns ([T, S + C] over the sinks and tail region: sinks up to the
    query's own position, the tail region never (its tokens are staged in the raw stream),
    [T, n_raw] over the raw stream from the current block's start (same block, causal),
    [T, n_new] over the piece's new slots (only those of blocks entirely before the query's)).
    """
    s, c = n_sinks, block_size
    pos = torch.arange(p0, p0 + t, device=device)  # [T]
    raw_start = max(p0, s) - offset_in_block(p0, s, c)  # a block start
    q_block = torch.where(pos >= s, torch.div(pos - raw_start, c, rounding_mode="floor"), -1)  # [T]
    head_vis = torch.arange(s + c, device=device)[None, :] <= pos[:, None]  # [T, S + C]
    head_vis[:, s:] = False
    raw_i = torch.arange(n_raw, device=device)
    raw_vis = ((raw_i // c)[None, :] == q_block[:, None]) & ((raw_start + raw_i)[None, :] <= pos[:, None])
    new_vis = (torch.arange(n_new, device=device) // slots_per_block)[None, :] < q_block[:, None]
    return tuple(neg_inf_where_not(m).to(dt) for m in (head_vis, raw_vis, new_vis))


def chunk_bias(out: torch.Tensor, masks, stored_bias: torch.Tensor, new_bias: torch.Tensor,
               raw0: int, new0: int) -> torch.Tensor:
    """Fill `out` [B, T, end], the additive bias over the keys glob[:end] of a chunk, and return it.

    Columns: [0, S + C) sinks and tail region (`masks[0]`), [S + C, raw0) the slots stored
    before this piece (`stored_bias` [B, n_stored]: log mass, visible to every query),
    [raw0, new0) the raw stream (`masks[1]`), [new0, end) the new slots (`masks[2]` +
    `new_bias` [B, n_new]: log mass). `masks` come from `global_position_masks`.
    """
    head, raw, new = masks
    slot0 = head.shape[1]
    out[:, :, :slot0] = head
    out[:, :, slot0:raw0] = stored_bias[:, None, :]
    out[:, :, raw0:new0] = raw
    out[:, :, new0:] = new + new_bias[:, None, :]
    return out
