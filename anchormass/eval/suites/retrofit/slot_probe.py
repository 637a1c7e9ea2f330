"""What stage 1 did with a needle, read off a model's parallel forward (docs/method.md §2.3, §6 j).

Read-only: forward pre-hooks on every layer's attention module record its input; q, k, v are then
recomputed with the module's own projections and RoPE, and the compression is the one
`compress_blocks` / `group_decisions` compute for the training path and the cache alike (the
rule's choice: a model with outlier_scorer="learned" is refused). Nothing in the model changes. Per layer and item:

- `emit`: the fraction of the item's compressed groups that emit an outlier slot;
- per answer copy, what stage 1 kept of it: `outlier` (its own key and value, mass 1), `anchor`
  (its key is the background slot's key, its value averaged with the group's), `averaged` (only
  its share of the background mean remains), `exact` (group_size = 1: its own slot, lossless), or
  `raw` (a sink, a token of the query's own block, or a Standard model: never compressed);
- `attn`: the attention mass the answering query puts on the fact, averaged over the global heads
  (AnchorMass: the slots of the groups that hold a token of the fact, with their +log(n) bias;
  Standard: all heads, on the fact's tokens).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from anchormass.errors import ConfigError
from anchormass.models.attention_base import repeat_kv
from anchormass.models.compression import anchor_index, compress_blocks, group_decisions
from anchormass.models.kernels.layout import query_view
from anchormass.models.rope import apply_rope

KEPT = ("outlier", "anchor", "exact", "raw")  # an answer copy whose own key reached the global heads
STATUSES = ("outlier", "anchor", "averaged", "exact", "raw")


@dataclass
class LayerQKV:
    q: torch.Tensor  # [B, H, T, D] post-RoPE
    k: torch.Tensor
    v: torch.Tensor


@contextmanager
def recorded_attention_inputs(model):
    """Collect (x, cos, sin) of every layer's attention during one forward: list indexed by layer."""
    seen: list = [None] * len(model.blocks)
    hooks = [block.attn.register_forward_pre_hook(lambda mod, args, i=i: seen.__setitem__(i, args[:3]))
             for i, block in enumerate(model.blocks)]
    try:
        yield seen
    finally:
        for h in hooks:
            h.remove()


def layer_qkv(model, recorded) -> list[LayerQKV]:
    """q, k, v per layer from the recorded attention inputs, as SelfAttention.forward computes them.

    With grouped-query attention k and v are copied to the query heads they serve: stage 1 on the
    copies makes the same decisions and slots as on the KV heads (its rule averages over heads),
    so the probe reads every query head alike."""
    out = []
    for block, (x, cos, sin) in zip(model.blocks, recorded):
        attn, g = block.attn, model.cfg.q_per_kv
        k = apply_rope(attn.split_heads(attn.k_proj(x)), cos, sin)
        out.append(LayerQKV(apply_rope(attn.split_heads(attn.q_proj(x)), cos, sin),
                            repeat_kv(k, g), repeat_kv(attn.split_heads(attn.v_proj(x)), g)))
    return out


@torch.no_grad()
def probe_forward(model, ids: torch.Tensor, positions: list[int]) -> tuple[torch.Tensor, list[LayerQKV]]:
    """(argmax next token at `positions` [B, n], q/k/v per layer) of one parallel forward."""
    with recorded_attention_inputs(model) as rec:
        hidden = model.forward_hidden(ids)
    return model.lm_head(hidden[:, positions]).argmax(-1), layer_qkv(model, rec)


class LayerView:
    """Stage-1 view of one layer for a batch: decisions per group, slots for the attention."""

    def __init__(self, cfg, qkv: LayerQKV):
        self.cfg, self.qkv = cfg, qkv
        t = qkv.k.shape[2]
        self.anchormass = cfg.arch == "anchormass"
        if self.anchormass and cfg.outlier_scorer == "learned":
            # The probe compresses k, v copied to the query heads; a learned scorer lives on the KV heads.
            raise ConfigError("the slot probe reads the rule's choice only; outlier_scorer='learned' is not supported")
        nl, s, c = cfg.n_local_heads, cfg.n_sinks, cfg.block_size
        self.n_blocks = max(0, t - s) // c if self.anchormass else 0
        if self.n_blocks:
            span = slice(s, s + self.n_blocks * c)
            kg, vg = qkv.k[:, nl:, span], qkv.v[:, nl:, span]
            self.idx, self.emit = group_decisions(vg, cfg)  # [B, ng]
            self.anchor = anchor_index(self.idx, self.emit, cfg.group_size)  # [B, ng]
            self.slot_k, self.slot_v, self.slot_mass = compress_blocks(kg, vg, cfg)  # [B, Hg, 2ng, D], [B, 2ng]

    def emit_rate(self, b: int) -> float | None:
        """Fraction of row b's groups that emit an outlier (None: nothing compressed / Standard)."""
        return float(self.emit[b].float().mean()) if self.n_blocks else None

    def status(self, b: int, p: int, query: int) -> str:
        """What stage 1 kept of position p, for a query at `query` (docs/method.md §2.2-2.3)."""
        cfg = self.cfg
        if not self.anchormass:
            return "raw"
        view = query_view(query, cfg.n_sinks, cfg.block_size, self.n_blocks)
        if not cfg.n_sinks <= p < view.compressed_end:  # a sink, or the query's own block: raw
            return "raw"
        g, i = divmod(p - cfg.n_sinks, cfg.group_size)
        if cfg.group_size == 1:
            return "exact"
        if bool(self.emit[b, g]) and int(self.idx[b, g]) == i:
            return "outlier"
        return "anchor" if i == int(self.anchor[b, g]) else "averaged"

    def attention(self, b: int, t: int) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
        """What query t of row b attends to: (weights [H', K] over the global heads (Standard: all),
        values [H', K, D], and per key the positions [lo, hi) it stands for), docs/method.md §2.2."""
        cfg, qkv = self.cfg, self.qkv
        scale = 1.0 / math.sqrt(cfg.head_dim)
        if not self.anchormass:
            w = torch.softmax((qkv.k[b, :, :t + 1] @ qkv.q[b, :, t, :, None]).squeeze(-1).double() * scale, dim=-1)
            return w, qkv.v[b, :, :t + 1], [(j, j + 1) for j in range(t + 1)]
        nl, s, c, g = cfg.n_local_heads, cfg.n_sinks, cfg.block_size, cfg.group_size
        view = query_view(t, s, c, self.n_blocks)
        n_sink, tail0 = view.n_sink, view.tail_start
        n_groups = view.slot_blocks * (c // g)  # groups of the blocks seen as slots
        kg, vg = qkv.k[b, nl:], qkv.v[b, nl:]
        keys = torch.cat([kg[:, :n_sink], self.slot_k[b, :, :2 * n_groups], kg[:, tail0:t + 1]], dim=1)
        vals = torch.cat([vg[:, :n_sink], self.slot_v[b, :, :2 * n_groups], vg[:, tail0:t + 1]], dim=1)
        mass = torch.cat([torch.ones(n_sink), self.slot_mass[b, :2 * n_groups].float().cpu(),
                          torch.ones(t + 1 - tail0)]).double()
        logits = (keys @ qkv.q[b, nl:, t, :, None]).squeeze(-1).double().cpu() * scale  # [Hg, K]
        bias = mass.log() if cfg.mass_bias else torch.where(mass > 0, 0.0, -math.inf).double()
        spans = ([(j, j + 1) for j in range(n_sink)]
                 + [(s + (i // 2) * g, s + (i // 2 + 1) * g) for i in range(2 * n_groups)]
                 + [(j, j + 1) for j in range(tail0, t + 1)])
        return torch.softmax(logits + bias, dim=-1), vals, spans

    def attention_on(self, b: int, t: int, lo: int, hi: int) -> float:
        """Attention mass of query t (row b) on the keys that hold a token of [lo, hi) (a slot: one of
        its group's tokens), summed over those keys and averaged over the heads of `attention`."""
        w, _, spans = self.attention(b, t)
        on = torch.tensor([a < hi and lo < z for a, z in spans])
        return float(w[:, on].sum(-1).mean())
