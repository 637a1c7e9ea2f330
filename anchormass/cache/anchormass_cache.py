"""AnchorMass inference cache (SPEC 2.5): per layer a local ring, sinks, global slots with masses, a raw tail.

Per layer and batch of B sequences (Hl local heads, Hg global heads, head dim D):
  local ring   [B, Hl, W, D]   keys/values of the last W = cfg.window positions (slot = pos % W)
  sinks        [B, Hg, S, D]   the first S positions, raw forever (mass 1)
  slots        [B, Hg, cap, D] compressed blocks, chronological; mass [B, cap] (0 = empty);
                               count [B]: each sequence has its own count, because absent
                               outlier slots (mass 0) are not stored
  tail         [B, Hg, C, D]   raw tokens of the current, incomplete block
Buffers are allocated once at the first chunk (cap = budget + the slots one prefill chunk can
add before stage 2 runs); they only grow, by doubling, if a chunk brings more than that.

A chunk's queries see the cache as it stood at the start of the chunk plus the chunk's own
tokens, its completed blocks as slots and its current block raw (SPEC 2.2), which is the
parallel path's attention exactly; stage 1 is the same `compress_blocks` the parallel path
calls. Stage 2 runs in `after_forward` (once per model forward, after all layers).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from anchormass.cache.base import KVCache, LayerCache
from anchormass.cache.slot_policies import SlotPolicy
from anchormass.models.compression import compress_blocks
from anchormass.models.config import ModelConfig

# Queries per internal piece: bounds the [T, keys] masks of one very long chunk. Splitting a
# chunk changes nothing: stage 2 only runs between model forwards.
PIECE = 1024


def _neg_inf_where_not(visible: torch.Tensor) -> torch.Tensor:
    """bool -> float bias: 0 where visible, -inf elsewhere."""
    return torch.zeros(visible.shape, device=visible.device).masked_fill(~visible, -math.inf)


class AnchorMassLayerCache(LayerCache):
    def __init__(self, cfg: ModelConfig, batch_size: int, policy: SlotPolicy, budget: int,
                 device=None, dtype=None):
        self.cfg, self.batch_size, self.policy, self.budget = cfg, batch_size, policy, budget
        self.device, self.dtype = device, dtype
        self.n_seen = 0  # tokens this layer has attended
        self.local_k = self.local_v = None  # [B, Hl, W, D]
        self.sink_k = self.sink_v = None  # [B, Hg, S, D]
        self.slot_k = self.slot_v = None  # [B, Hg, cap, D]
        self.slot_mass = None  # [B, cap] fp32, 0 beyond each sequence's count
        self.counts = None  # [B] long
        self.tail_k = self.tail_v = None  # [B, Hg, C, D]

    # ------------------------------------------------------------------ buffers
    def _allocate(self, like: torch.Tensor) -> None:
        cfg, b = self.cfg, self.batch_size
        dev = self.device if self.device is not None else like.device
        dt = self.dtype if self.dtype is not None else like.dtype
        hl, hg, d = cfg.n_local_heads, cfg.n_global_heads, cfg.head_dim
        # A chunk of T tokens plus a tail of < C completes at most T // C + 1 blocks.
        cap = self.budget + (cfg.prefill_chunk // cfg.block_size + 1) * cfg.slots_per_block
        z = lambda *shape: torch.zeros(*shape, device=dev, dtype=dt)  # noqa: E731
        self.local_k, self.local_v = z(b, hl, cfg.window, d), z(b, hl, cfg.window, d)
        self.sink_k, self.sink_v = z(b, hg, cfg.n_sinks, d), z(b, hg, cfg.n_sinks, d)
        self.slot_k, self.slot_v = z(b, hg, cap, d), z(b, hg, cap, d)
        self.slot_mass = torch.zeros(b, cap, device=dev, dtype=torch.float32)
        self.counts = torch.zeros(b, device=dev, dtype=torch.long)
        self.tail_k, self.tail_v = z(b, hg, cfg.block_size, d), z(b, hg, cfg.block_size, d)

    def _ensure_capacity(self, needed: int) -> None:
        cap = self.slot_mass.shape[1]
        if needed <= cap:
            return
        while cap < needed:
            cap *= 2
        grow = lambda x: F.pad(x, (0, 0, 0, cap - x.shape[2]))  # noqa: E731  [B, Hg, cap, D]
        self.slot_k, self.slot_v = grow(self.slot_k), grow(self.slot_v)
        self.slot_mass = F.pad(self.slot_mass, (0, cap - self.slot_mass.shape[1]))

    def tensors(self):
        return [self.local_k, self.local_v, self.sink_k, self.sink_v, self.slot_k, self.slot_v,
                self.slot_mass, self.counts, self.tail_k, self.tail_v]

    # ------------------------------------------------------------------ attention
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v [B, H, T, D] post-RoPE at positions n_seen + arange(T) -> [B, H, T, D]."""
        if self.slot_mass is None:
            self._allocate(k)
        outs = []
        for s in range(0, q.shape[2], PIECE):
            piece = slice(s, s + PIECE)
            outs.append(self._attend_piece(q[:, :, piece], k[:, :, piece], v[:, :, piece]))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    def _attend_piece(self, q, k, v):
        nl = self.cfg.n_local_heads
        t = q.shape[2]
        pos = torch.arange(self.n_seen, self.n_seen + t, device=q.device)  # [T] absolute positions
        out = torch.empty_like(q)
        if nl:
            out[:, :nl] = self._attend_local(q[:, :nl], k[:, :nl], v[:, :nl], pos)
        out[:, nl:] = self._attend_global(q[:, nl:], k[:, nl:], v[:, nl:], pos)
        self.n_seen += t
        return out

    def _attend_local(self, q, k, v, pos):
        """SPEC 2.1: position t sees t - W < j <= t. q, k, v [B, Hl, T, D]."""
        w, p0 = self.cfg.window, self.n_seen
        # Position held by ring slot i: the latest p < p0 with p % W == i (negative = empty).
        ring_pos = p0 - 1 - torch.remainder(p0 - 1 - torch.arange(w, device=q.device), w)  # [W]
        key_pos = torch.cat([ring_pos, pos])  # [W + T]
        diff = pos[:, None] - key_pos[None, :]  # [T, W + T]
        visible = (key_pos[None, :] >= 0) & (diff >= 0) & (diff < w)
        keys = torch.cat([self.local_k.to(k.dtype), k], dim=2)  # [B, Hl, W + T, D]
        vals = torch.cat([self.local_v.to(v.dtype), v], dim=2)
        out = F.scaled_dot_product_attention(q, keys, vals, attn_mask=visible)
        m = min(q.shape[2], w)  # the last m tokens of the piece enter the ring
        ring_idx = torch.remainder(pos[-m:], w)
        self.local_k[:, :, ring_idx] = k[:, :, -m:].to(self.local_k.dtype)
        self.local_v[:, :, ring_idx] = v[:, :, -m:].to(self.local_v.dtype)
        return out

    def _attend_global(self, q, k, v, pos):
        """SPEC 2.2 for the global heads. q, k, v [B, Hg, T, D]."""
        cfg, p0, t = self.cfg, self.n_seen, q.shape[2]
        s, c = cfg.n_sinks, cfg.block_size
        dev, dt = q.device, q.dtype

        # Sinks: store this piece's positions < S first, then every query sees sinks <= itself.
        n_new_sink = max(0, min(s - p0, t))
        self.sink_k[:, :, p0:p0 + n_new_sink] = k[:, :, :n_new_sink].to(self.sink_k.dtype)
        self.sink_v[:, :, p0:p0 + n_new_sink] = v[:, :, :n_new_sink].to(self.sink_v.dtype)
        n_sink = min(s, p0 + t)

        # Raw stream from the start of the current block: old tail + this piece's non-sink tokens.
        r0 = (p0 - s) % c if p0 >= s else 0
        raw_k = torch.cat([self.tail_k[:, :, :r0].to(dt), k[:, :, n_new_sink:]], dim=2)  # [B, Hg, R, D]
        raw_v = torch.cat([self.tail_v[:, :, :r0].to(dt), v[:, :, n_new_sink:]], dim=2)
        raw_start = max(p0, s) - r0  # absolute position of raw index 0 (a block start)
        n_raw = raw_k.shape[2]
        n_blocks = n_raw // c  # blocks this piece completes
        if n_blocks:
            new_k, new_v, new_mass = compress_blocks(raw_k[:, :, :n_blocks * c], raw_v[:, :, :n_blocks * c], cfg)
        else:  # most decode steps: skip stage 1's fixed cost
            new_k, new_v = raw_k[:, :, :0], raw_v[:, :, :0]
            new_mass = torch.zeros(q.shape[0], 0, device=dev)

        # Visibility. Block index of a query relative to raw_start; -1 for sink positions.
        q_block = torch.where(pos >= s, torch.div(pos - raw_start, c, rounding_mode="floor"), -1)  # [T]
        raw_pos = raw_start + torch.arange(n_raw, device=dev)  # [R]
        raw_block = torch.div(raw_pos - raw_start, c, rounding_mode="floor")
        new_block = torch.arange(new_mass.shape[1], device=dev) // cfg.slots_per_block  # [N]
        sink_vis = torch.arange(n_sink, device=dev)[None, :] <= pos[:, None]  # [T, S']
        new_vis = new_block[None, :] < q_block[:, None]  # [T, N]: blocks entirely before t's block
        raw_vis = (raw_block[None, :] == q_block[:, None]) & (raw_pos[None, :] <= pos[:, None])  # [T, R]
        # Old slots come from blocks completed before this piece: visible to every query that
        # has a block (there are none yet while queries are still sinks).
        n_old = int(self.counts.max())
        old_mass = self.slot_mass[:, :n_old]  # [B, n_old]

        b = q.shape[0]
        mass_bias = self._mass_bias
        bias = torch.cat([
            _neg_inf_where_not(sink_vis).expand(b, t, n_sink),
            mass_bias(old_mass)[:, None, :].expand(b, t, n_old),
            mass_bias(new_mass)[:, None, :] + _neg_inf_where_not(new_vis)[None],
            _neg_inf_where_not(raw_vis).expand(b, t, n_raw),
        ], dim=2)  # [B, T, K]
        keys = torch.cat([self.sink_k[:, :, :n_sink].to(dt), self.slot_k[:, :, :n_old].to(dt),
                          new_k.to(dt), raw_k], dim=2)  # [B, Hg, K, D]
        vals = torch.cat([self.sink_v[:, :, :n_sink].to(dt), self.slot_v[:, :, :n_old].to(dt),
                          new_v.to(dt), raw_v], dim=2)
        out = F.scaled_dot_product_attention(q, keys, vals, attn_mask=bias[:, None].to(dt))

        if n_blocks:
            self._append_slots(new_k, new_v, new_mass)
        rest = n_raw - n_blocks * c  # the new tail
        self.tail_k[:, :, :rest] = raw_k[:, :, n_blocks * c:].to(self.tail_k.dtype)
        self.tail_v[:, :, :rest] = raw_v[:, :, n_blocks * c:].to(self.tail_v.dtype)
        return out

    def _mass_bias(self, mass: torch.Tensor) -> torch.Tensor:
        """+log(mass) logits (SPEC 2.2); with cfg.mass_bias off only mass 0 is masked."""
        mass = mass.float()
        if self.cfg.mass_bias:
            return mass.log()
        return torch.zeros_like(mass).masked_fill(mass <= 0, -math.inf)

    def _append_slots(self, new_k, new_v, new_mass) -> None:
        """Store the present slots (mass > 0) after each sequence's own count, in order."""
        present = new_mass > 0  # [B, N]
        added = present.sum(dim=1)  # [B]
        self._ensure_capacity(int((self.counts + added).max()))
        b_idx, n_idx = present.nonzero(as_tuple=True)  # [P] each
        dest = self.counts[b_idx] + present.long().cumsum(dim=1)[b_idx, n_idx] - 1
        self.slot_k[b_idx, :, dest] = new_k[b_idx, :, n_idx].to(self.slot_k.dtype)  # [P, Hg, D]
        self.slot_v[b_idx, :, dest] = new_v[b_idx, :, n_idx].to(self.slot_v.dtype)
        self.slot_mass[b_idx, dest] = new_mass[b_idx, n_idx].float()
        self.counts += added

    # ------------------------------------------------------------------ stage 2 and stats
    def after_forward(self) -> None:
        if self.counts is None:
            return
        for b in (self.counts > self.budget).nonzero().flatten().tolist():
            n = int(self.counts[b])
            keys, vals, mass = self.policy.reduce(self.slot_k[b, :, :n], self.slot_v[b, :, :n],
                                                  self.slot_mass[b, :n], self.budget)
            m = mass.shape[0]
            self.slot_k[b, :, :m], self.slot_v[b, :, :m], self.slot_mass[b, :m] = keys, vals, mass
            self.slot_k[b, :, m:n] = 0
            self.slot_v[b, :, m:n] = 0
            self.slot_mass[b, m:n] = 0
            self.counts[b] = m

    def seq_stats(self) -> tuple[list[int], list[float]]:
        """Per sequence: stored slots, and mass of sinks + slots + tail."""
        cfg = self.cfg
        if self.counts is None:
            return [0] * self.batch_size, [0.0] * self.batch_size
        raw = min(self.n_seen, cfg.n_sinks)
        if self.n_seen > cfg.n_sinks:
            raw += (self.n_seen - cfg.n_sinks) % cfg.block_size
        mass = self.slot_mass.double().sum(dim=1) + raw
        return self.counts.tolist(), [float(x) for x in mass.tolist()]

    def stats(self) -> dict:
        slots, mass = self.seq_stats()
        if self.batch_size == 1:
            return {"slots": slots[0], "mass": mass[0]}
        return {"slots": slots, "mass": mass}


class AnchorMassCache(KVCache):
    """One `AnchorMassLayerCache` per layer; `policy` and `budget` (slots, per layer and sequence)."""

    def __init__(self, cfg: ModelConfig, batch_size: int, policy: SlotPolicy, budget: int,
                 device=None, dtype=None):
        layers = [AnchorMassLayerCache(cfg, batch_size, policy, budget, device, dtype)
                  for _ in range(cfg.n_layers)]
        super().__init__(layers, batch_size)
        self.cfg, self.policy, self.budget = cfg, policy, budget
