"""Index arithmetic of the global layout (docs/method.md §2.2), shared by the kernels.

Positions 0..S-1 are sinks; position t >= S lies in block (t - S) // C. Sinks are given
block -1 so "slot block < query block" and "same block" tests work for every position.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from anchormass.models.compression import compress_blocks
from anchormass.models.config import ModelConfig


def block_of(pos: torch.Tensor, n_sinks: int, block_size: int) -> torch.Tensor:
    """Block index of each position; -1 for sink positions."""
    return torch.where(pos >= n_sinks, torch.div(pos - n_sinks, block_size, rounding_mode="floor"), -1)


def offset_in_block(pos: int, n_sinks: int, block_size: int) -> int:
    """How far position `pos` lies into its block: the raw tail tokens before it; 0 for sinks."""
    return (pos - n_sinks) % block_size if pos >= n_sinks else 0


@dataclass(frozen=True)
class QueryView:
    """What a global head's query at position `t` attends to (docs/method.md §2.2), in positions:
    the sinks [0, n_sink) raw; [n_sinks, compressed_end), the complete blocks before its own, through
    their slots (`slot_blocks` blocks of slots_per_block slots each); its own block [tail_start, t] raw."""

    t: int
    n_sink: int
    slot_blocks: int
    compressed_end: int
    tail_start: int


def query_view(t: int, n_sinks: int, block_size: int, complete_blocks: int | None = None) -> QueryView:
    """The QueryView of position `t`; `complete_blocks` caps the compressed blocks at those a
    sequence holds whole (a parallel forward compresses only those)."""
    own = block_of(torch.tensor(t), n_sinks, block_size).item()  # -1 for a sink
    slot_blocks = max(0, own if complete_blocks is None else min(own, complete_blocks))
    tail_start = t - offset_in_block(t, n_sinks, block_size) if t >= n_sinks else t + 1
    return QueryView(t, min(n_sinks, t + 1), slot_blocks, n_sinks + slot_blocks * block_size, tail_start)


def slot_log_mass(slot_mass: torch.Tensor, mass_bias: bool) -> torch.Tensor:
    """Additive logit term per slot, fp32: log(mass), or 0 when the bias is ablated; -inf for mass 0."""
    mass = slot_mass.float()
    if mass_bias:
        return mass.log()  # log(0) = -inf: absent slots vanish from the softmax
    return torch.where(mass > 0, 0.0, float("-inf")).to(mass.dtype)


def global_slots(k: torch.Tensor, v: torch.Tensor, cfg: ModelConfig, scorer: torch.Tensor | None = None):
    """Slots of every complete block of k, v [B, Hg, T, D] (sinks excluded); scorer: the layer's
    learned outlier scorer [Hg, D] (outlier_scorer="learned"), else None.

    Returns (n_sink, slot_k, slot_v, slot_log_mass [B, n_slots] fp32).
    """
    t = k.shape[2]
    n_sink = min(cfg.n_sinks, t)
    n_blocks = (t - n_sink) // cfg.block_size
    end = n_sink + n_blocks * cfg.block_size
    slot_k, slot_v, slot_mass = compress_blocks(k[:, :, n_sink:end], v[:, :, n_sink:end], cfg, scorer=scorer)
    return n_sink, slot_k, slot_v, slot_log_mass(slot_mass, cfg.mass_bias)
