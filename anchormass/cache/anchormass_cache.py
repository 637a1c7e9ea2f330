"""AnchorMass inference cache (docs/method.md §2.5): per layer a local ring, sinks, global slots with masses,
a raw tail.

Per layer and batch of B sequences (Hl local heads, Hg global heads, head dim D; all KV heads:
with grouped-query attention Hl = n_local_heads / q_per_kv and Hg likewise, which is its memory
saving, and each stored KV head serves its group of query heads when they attend):
  local ring  local_k/v [B, Hl, W, D]   the last W = cfg.window positions (ring slot = pos % W)
  global      glob_k/v  [B, Hg, S + C + cap, D], one buffer in three regions:
                [0, S)        sinks: the first S positions, raw forever
                [S, S + C)    tail: raw tokens of the current, incomplete block
                [S + C, ...)  slots: compressed blocks, chronological, per-sequence count
              mass [B, S + C + cap] fp32: 1 for raw entries present, the slot masses, 0 = empty
  counts [B]  stored slots per sequence: absent outlier slots (mass 0) are not stored, so
              sequences differ
One buffer means a decode step attends to one contiguous slice with bias log(mass), with no
copies and no per-step masks. The slot region starts at the slots one prefill chunk can add
(`headroom`) and doubles when the stored slots outgrow it, so `nbytes` follows what is stored
(within 2x); once a doubling would reach the budget it jumps to its final size budget +
headroom, which stage 2 keeps the store within, so from then on `nbytes` is constant. Only a
chunk longer than `cfg.prefill_chunk` can grow it further (again by doubling). `end_prefill`
gives the prefill headroom back: decoding needs budget + one block's slots. A doubling
copies the buffer once: O(stored) per growth, never a per-token cat.

A chunk's queries see the cache as it stood at the start of the chunk plus the chunk's own
tokens, its completed blocks as slots and its current block raw (docs/method.md §2.2): the parallel
path's attention exactly. To attend without concatenating keys per chunk, a chunk stages its
raw stream (old tail + new tokens) and its new slots in the buffer right after the stored
slots, and attends to one slice glob[:end]; glob_k/v therefore carry, past the slot capacity,
stage rows for one piece: per-chunk working memory, which
`nbytes` leaves out and which `end_prefill` (or the first decode step) drops. The
position-only parts of the chunk masks are built once per forward and shared by the layers.
Stage 1 is the same `compress_blocks` the parallel path calls, with the layer's learned outlier
scorer when the model has one (handed in with each `attend`). Stage 2 runs in `after_forward`
(once per model forward, after all layers).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from anchormass.cache.base import KVCache, LayerCache
from anchormass.cache.chunk_masks import chunk_bias, global_position_masks, local_chunk_visible, ring_positions
from anchormass.cache.slot_policies import SlotPolicy
from anchormass.models.compression import compress_blocks
from anchormass.models.config import ModelConfig
from anchormass.models.kernels.block_sdpa import is_gqa, sdpa_fp32_bias
from anchormass.models.kernels.layout import offset_in_block, slot_log_mass

# Queries per internal piece: bounds the [T, keys] masks of one very long chunk. Splitting a
# chunk changes nothing: stage 2 only runs between model forwards.
PIECE = 1024


class PrefillScratch:
    """Chunk-path scratch shared by the layers of one cache (all layers see the same positions).

    Holds the masks of the latest piece (keyed by what they depend on, so a layer never
    reuses another piece's) and one flat buffer the per-layer [B, T, K] bias is built in:
    a fresh allocation of that size per layer and piece costs page faults on CPU. Not cache
    state: nothing in it outlives the piece, and `nbytes` does not count it.
    """

    def __init__(self):
        self.masks: dict = {}
        self.buf: torch.Tensor | None = None

    def get(self, key):
        return self.masks.get(key)

    def put(self, key, value) -> None:
        if len(self.masks) > 8:  # keys of earlier pieces are never asked for again
            self.masks.clear()
        self.masks[key] = value

    def buffer(self, numel: int, dtype: torch.dtype, device) -> torch.Tensor:
        buf = self.buf
        if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != device:
            buf = self.buf = torch.empty(numel, dtype=dtype, device=device)
        return buf[:numel]

    def clear(self) -> None:
        self.masks.clear()
        self.buf = None


class AnchorMassLayerCache(LayerCache):
    def __init__(self, cfg: ModelConfig, batch_size: int, policy: SlotPolicy,
                 device=None, dtype=None, scratch: PrefillScratch | None = None):
        self.cfg, self.batch_size, self.policy, self.budget = cfg, batch_size, policy, policy.budget
        self.device, self.dtype = device, dtype
        self.scratch = PrefillScratch() if scratch is None else scratch
        self.n_seen = 0  # tokens this layer has attended
        self.slot0 = cfg.n_sinks + cfg.block_size  # first slot index in the global buffer
        self.local_k = self.local_v = None  # [B, Hl, W, D]
        self.glob_k = self.glob_v = None  # [B, Hg, S + C + cap, D]
        self.mass = None  # [B, S + C + cap] fp32
        self.counts = None  # [B] long
        self.max_count = 0  # host copy of counts.max(): no device sync per decode step
        self.forced = None  # [B, P] bool: evaluation-only oracle outliers (AnchorMassCache.force_outliers)

    # ------------------------------------------------------------------ buffers
    def _allocate(self, like: torch.Tensor) -> None:
        cfg, b = self.cfg, self.batch_size
        dev = self.device if self.device is not None else like.device
        dt = self.dtype if self.dtype is not None else like.dtype
        hl, hg, d = cfg.n_local_kv_heads, cfg.n_global_kv_heads, cfg.head_dim
        # Invariant kept by _ensure_capacity: cap < budget or cap >= full_capacity.
        cap = self.headroom if self.headroom < self.budget else self.full_capacity
        self.local_k = torch.zeros(b, hl, cfg.window, d, device=dev, dtype=dt)
        self.local_v = torch.zeros_like(self.local_k)
        self.glob_k = torch.zeros(b, hg, self.slot0 + cap, d, device=dev, dtype=dt)
        self.glob_v = torch.zeros_like(self.glob_k)
        self.mass = torch.zeros(b, self.slot0 + cap, device=dev, dtype=torch.float32)
        self.counts = torch.zeros(b, device=dev, dtype=torch.long)

    @property
    def headroom(self) -> int:
        """Slots one prefill chunk can add: T tokens plus a tail of < C complete <= T // C + 1 blocks."""
        return (self.cfg.prefill_chunk // self.cfg.block_size + 1) * self.cfg.slots_per_block

    @property
    def full_capacity(self) -> int:
        """Final slot capacity: a store at the budget plus one chunk's new slots, before stage 2 runs."""
        return self.budget + self.headroom

    @property
    def capacity(self) -> int:
        """Slots the buffers hold now (0 before the first chunk)."""
        return 0 if self.mass is None else self.mass.shape[1] - self.slot0

    @property
    def slot_k(self) -> torch.Tensor:  # [B, Hg, cap, D] views of the slot region (no stage rows)
        return self.glob_k[:, :, self.slot0:self.slot0 + self.capacity]

    @property
    def slot_v(self) -> torch.Tensor:
        return self.glob_v[:, :, self.slot0:self.slot0 + self.capacity]

    @property
    def slot_mass(self) -> torch.Tensor:  # [B, cap]
        return self.mass[:, self.slot0:]

    def _ensure_capacity(self, needed: int) -> None:
        cap = self.capacity
        if needed <= cap:
            return
        full = self.full_capacity
        while cap < needed:
            # Below the budget: double. Reaching it: jump straight to the final size, so the
            # buffers stop changing once the store is at the budget (one step past it only
            # for chunks longer than prefill_chunk).
            cap = cap * 2 if cap >= full or cap * 2 < self.budget else full
        extra = cap - self.capacity
        self.glob_k = F.pad(self.glob_k, (0, 0, 0, extra))
        self.glob_v = F.pad(self.glob_v, (0, 0, 0, extra))
        self.mass = F.pad(self.mass, (0, extra))

    def tensors(self):
        if self.mass is None:
            return []
        # The stage rows past slot0 + capacity are per-piece scratch, not stored state: nbytes
        # leaves them out.
        rows = self.slot0 + self.capacity
        return [self.local_k, self.local_v, self.glob_k[:, :, :rows], self.glob_v[:, :, :rows], self.mass, self.counts]

    # ------------------------------------------------------------------ attention
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scorer: torch.Tensor | None = None) -> torch.Tensor:
        """q [B, H, T, D], k, v [B, H_kv, T, D] post-RoPE at positions n_seen + arange(T) -> [B, H, T, D].
        scorer: the layer's learned outlier scorer [Hg_kv, D] (outlier_scorer="learned"), else None."""
        if self.mass is None:
            self._allocate(k)
        outs = []
        for s in range(0, q.shape[2], PIECE):
            piece = slice(s, s + PIECE)
            outs.append(self._attend_piece(q[:, :, piece], k[:, :, piece], v[:, :, piece], scorer))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)

    def _attend_piece(self, q, k, v, scorer):
        nl, nkl, t = self.cfg.n_local_heads, self.cfg.n_local_kv_heads, q.shape[2]
        out = torch.empty_like(q)
        if t == 1:  # decode: write first, then attend to buffer slices
            self._drop_stage()  # prefill scratch must not outlive the prefill, end_prefill() or not
            if nl:
                out[:, :nl] = self._decode_local(q[:, :nl], k[:, :nkl], v[:, :nkl])
            out[:, nl:] = self._decode_global(q[:, nl:], k[:, nkl:], v[:, nkl:], scorer)
        else:
            pos = torch.arange(self.n_seen, self.n_seen + t, device=q.device)  # [T] absolute positions
            if nl:
                out[:, :nl] = self._chunk_local(q[:, :nl], k[:, :nkl], v[:, :nkl], pos)
            out[:, nl:] = self._chunk_global(q[:, nl:], k[:, nkl:], v[:, nkl:], pos, scorer)
        self.n_seen += t
        return out

    # local heads (docs/method.md §2.1: position t sees t - W < j <= t)
    def _decode_local(self, q, k, v):
        p0, w = self.n_seen, self.cfg.window
        self.local_k[:, :, p0 % w] = k[:, :, 0].to(self.local_k.dtype)
        self.local_v[:, :, p0 % w] = v[:, :, 0].to(self.local_v.dtype)
        # After the write the ring holds exactly positions p0 - W + 1 .. p0 (those >= 0).
        mask = None if p0 + 1 >= w else (ring_positions(p0 + 1, w, q.device) >= 0)[None]  # [1, W]
        return F.scaled_dot_product_attention(q, self.local_k.to(q.dtype), self.local_v.to(q.dtype), attn_mask=mask,
                                              enable_gqa=is_gqa(q, k))

    def _chunk_local(self, q, k, v, pos):
        w, p0 = self.cfg.window, self.n_seen
        key = ("local", p0, pos.shape[0], q.device)
        visible = self.scratch.get(key)  # the same in every layer of this forward
        if visible is None:
            visible = local_chunk_visible(p0, pos, w)  # [T, W + T]
            self.scratch.put(key, visible)
        keys = torch.cat([self.local_k.to(k.dtype), k], dim=2)  # [B, Hl, W + T, D]
        vals = torch.cat([self.local_v.to(v.dtype), v], dim=2)
        out = F.scaled_dot_product_attention(q, keys, vals, attn_mask=visible, enable_gqa=is_gqa(q, k))
        m = min(q.shape[2], w)  # the last m tokens of the piece enter the ring
        ring_idx = torch.remainder(pos[-m:], w)
        self.local_k[:, :, ring_idx] = k[:, :, -m:].to(self.local_k.dtype)
        self.local_v[:, :, ring_idx] = v[:, :, -m:].to(self.local_v.dtype)
        return out

    # global heads (docs/method.md §2.2)
    def _mass_bias(self, mass: torch.Tensor) -> torch.Tensor:
        """+log(mass) logits; with cfg.mass_bias off only mass 0 (absent) is masked."""
        return slot_log_mass(mass, self.cfg.mass_bias)

    def _decode_global(self, q, k, v, scorer):
        """One token: it is a sink or joins the tail; it sees every present entry (mass > 0)."""
        cfg, p0 = self.cfg, self.n_seen
        s, c = cfg.n_sinks, cfg.block_size
        r0 = offset_in_block(p0, s, c)
        idx = p0 if p0 < s else s + r0
        self.glob_k[:, :, idx] = k[:, :, 0].to(self.glob_k.dtype)
        self.glob_v[:, :, idx] = v[:, :, 0].to(self.glob_v.dtype)
        self.mass[:, idx] = 1.0
        end = self.slot0 + self.max_count
        bias = self._mass_bias(self.mass[:, :end])[:, None, None, :]  # [B, 1, 1, K], fp32
        # log(mass) reaches the scores in fp32, as in the parallel kernels (docs/method.md §2.4).
        out = sdpa_fp32_bias(q, self.glob_k[:, :, :end], self.glob_v[:, :, :end], bias)
        if p0 >= s and r0 + 1 == c:  # the block is complete: compress it, empty the tail
            tail = slice(s, s + c)
            self._append_slots(*compress_blocks(self.glob_k[:, :, tail], self.glob_v[:, :, tail], cfg,
                                                forced=self._forced(p0 + 1 - c, c), scorer=scorer))
            self.mass[:, tail] = 0.0
        return out

    def _chunk_global(self, q, k, v, pos, scorer):
        cfg, p0, t = self.cfg, self.n_seen, q.shape[2]
        s, c = cfg.n_sinks, cfg.block_size
        b = q.shape[0]

        # Sinks: store this piece's positions < S first, then every query sees sinks <= itself.
        n_new_sink = max(0, min(s - p0, t))
        self.glob_k[:, :, p0:p0 + n_new_sink] = k[:, :, :n_new_sink].to(self.glob_k.dtype)
        self.glob_v[:, :, p0:p0 + n_new_sink] = v[:, :, :n_new_sink].to(self.glob_v.dtype)
        self.mass[:, p0:p0 + n_new_sink] = 1.0

        # Stage, right after the stored slots, the raw stream from the start of the current
        # block (old tail + this piece's non-sink tokens) and then the slots of the blocks it
        # completes: the keys are then one contiguous slice of the buffer, no per-chunk cat.
        r0 = offset_in_block(p0, s, c)
        n_raw = r0 + t - n_new_sink
        n_blocks = n_raw // c  # blocks this piece completes
        n_new = n_blocks * cfg.slots_per_block
        self._ensure_stage(t)
        raw0 = self.slot0 + self.max_count  # [raw0, new0): raw stream, [new0, end): new slots
        new0, end = raw0 + n_raw, raw0 + n_raw + n_new
        for buf, x in ((self.glob_k, k), (self.glob_v, v)):
            buf[:, :, raw0:raw0 + r0] = buf[:, :, s:s + r0]
            buf[:, :, raw0 + r0:new0] = x[:, :, n_new_sink:]
        if n_blocks:
            done = slice(raw0, raw0 + n_blocks * c)
            new_k, new_v, new_mass = compress_blocks(self.glob_k[:, :, done], self.glob_v[:, :, done], cfg,
                                                     forced=self._forced(max(p0, s) - r0, n_blocks * c),
                                                     scorer=scorer)
            self.glob_k[:, :, new0:end] = new_k
            self.glob_v[:, :, new0:end] = new_v
        else:
            new_mass = torch.zeros(b, 0, device=q.device)

        bias = self._chunk_bias(b, t, raw0, new0, end, new_mass, torch.float32)  # [B, T, end]
        out = sdpa_fp32_bias(q, self.glob_k[:, :, :end], self.glob_v[:, :, :end], bias[:, None])  # [B, Hg, T, D]

        # The new tail, copied out of the stage before _append_slots (which may reallocate).
        rest = n_raw - n_blocks * c
        if n_raw:  # (a piece of sinks only leaves the empty tail as it is)
            self.glob_k[:, :, s:s + rest] = self.glob_k[:, :, new0 - rest:new0]
            self.glob_v[:, :, s:s + rest] = self.glob_v[:, :, new0 - rest:new0]
            self.mass[:, s:s + rest] = 1.0
            self.mass[:, s + rest:self.slot0] = 0.0
        if n_blocks:
            self._append_slots(new_k, new_v, new_mass)
        return out

    def _forced(self, start: int, n: int) -> torch.Tensor | None:
        """The oracle's marks for positions [start, start + n) ([B, n] bool; none past the prompt)."""
        if self.forced is None:
            return None
        out = torch.zeros(self.forced.shape[0], n, dtype=torch.bool, device=self.forced.device)
        piece = self.forced[:, start:start + n]
        out[:, :piece.shape[1]] = piece
        return out

    def _chunk_bias(self, b, t, raw0, new0, end, new_mass, dt) -> torch.Tensor:
        """[B, T, end] additive bias over the keys glob[:end] of `_chunk_global` (see `chunk_masks.chunk_bias`),
        built in the shared scratch buffer: a fresh allocation per layer and piece costs page faults on CPU."""
        masks = self._position_masks(t, new0 - raw0, end - new0, dt)
        out = self.scratch.buffer(b * t * end, dt, masks[0].device).view(b, t, end)
        return chunk_bias(out, masks, self._mass_bias(self.mass[:, self.slot0:raw0]),
                          self._mass_bias(new_mass.float()), raw0, new0)

    def _position_masks(self, t, n_raw, n_new, dt):
        """`chunk_masks.global_position_masks` of this piece, built once per forward: they depend on
        the piece's positions only, so the layers of one forward share them."""
        cfg, p0, dev = self.cfg, self.n_seen, self.mass.device
        key = ("global", p0, t, n_raw, n_new, dt, dev)
        masks = self.scratch.get(key)
        if masks is None:
            masks = global_position_masks(p0, t, n_raw, n_new, cfg.n_sinks, cfg.block_size,
                                          cfg.slots_per_block, dt, dev)
            self.scratch.put(key, masks)
        return masks

    def _ensure_stage(self, t: int) -> None:
        """Rows after the slot capacity in glob_k/v for `_chunk_global`'s raw stream and new
        slots of a t-token piece (bound: a tail of < C plus t tokens, and their blocks' slots).
        Scratch, not stored state: `tensors()` leaves them out and `end_prefill` drops them."""
        cfg = self.cfg
        n_raw = cfg.block_size - 1 + t
        need = self.slot0 + self.capacity + n_raw + n_raw // cfg.block_size * cfg.slots_per_block
        extra = need - self.glob_k.shape[2]
        if extra > 0:
            self.glob_k = F.pad(self.glob_k, (0, 0, 0, extra))
            self.glob_v = F.pad(self.glob_v, (0, 0, 0, extra))

    def _append_slots(self, new_k, new_v, new_mass) -> None:
        """Store the present slots (mass > 0) after each sequence's own count, in order."""
        present = new_mass > 0  # [B, N]
        added = present.sum(dim=1)  # [B]
        self.max_count = int((self.counts + added).max())
        self._ensure_capacity(self.max_count)
        b_idx, n_idx = present.nonzero(as_tuple=True)  # [P] each
        dest = self.slot0 + self.counts[b_idx] + present.long().cumsum(dim=1)[b_idx, n_idx] - 1
        self.glob_k[b_idx, :, dest] = new_k[b_idx, :, n_idx].to(self.glob_k.dtype)  # [P, Hg, D]
        self.glob_v[b_idx, :, dest] = new_v[b_idx, :, n_idx].to(self.glob_v.dtype)
        self.mass[b_idx, dest] = new_mass[b_idx, n_idx].float()
        self.counts += added

    # ------------------------------------------------------------------ stage 2 and stats
    def after_forward(self) -> None:
        if self.max_count <= self.budget:
            return
        for b in (self.counts > self.budget).nonzero().flatten().tolist():
            n = int(self.counts[b])
            region = slice(self.slot0, self.slot0 + n)
            keys, vals, mass = self.policy.reduce(self.glob_k[b, :, region], self.glob_v[b, :, region],
                                                  self.mass[b, region])
            m = mass.shape[0]
            kept, freed = slice(self.slot0, self.slot0 + m), slice(self.slot0 + m, self.slot0 + n)
            self.glob_k[b, :, kept], self.glob_v[b, :, kept], self.mass[b, kept] = keys, vals, mass
            self.glob_k[b, :, freed], self.glob_v[b, :, freed], self.mass[b, freed] = 0, 0, 0
            self.counts[b] = m
        self.max_count = int(self.counts.max())

    def end_prefill(self) -> None:
        """Drop the prefill stage rows (see `_ensure_stage`), the shared chunk scratch and the slot
        headroom kept for prefill chunks: a decode step adds at most one block's slots before
        stage 2 runs, so budget + slots_per_block suffices (a later long chunk grows it again)."""
        self.scratch.clear()
        self._drop_stage()
        keep = self.budget + self.cfg.slots_per_block
        if self.capacity > keep:
            rows = self.slot0 + keep
            self.glob_k = self.glob_k[:, :, :rows].clone()
            self.glob_v = self.glob_v[:, :, :rows].clone()
            self.mass = self.mass[:, :rows].clone()

    def _drop_stage(self) -> None:
        if self.glob_k is not None and self.glob_k.shape[2] > self.slot0 + self.capacity:
            rows = self.slot0 + self.capacity
            self.glob_k = self.glob_k[:, :, :rows].clone()
            self.glob_v = self.glob_v[:, :, :rows].clone()

    def stored_nbytes(self) -> int:
        """The filled local-ring rows; over the global heads the present sinks and tail tokens
        and the stored slots, each slot with its fp32 mass; summed over the sequences. Heads are
        KV heads (what the buffers hold)."""
        if self.mass is None:
            return 0
        cfg, el = self.cfg, self.glob_k.element_size()
        local = 2 * self.batch_size * cfg.n_local_kv_heads * min(self.n_seen, cfg.window) * cfg.head_dim * el
        raw = int((self.mass[:, :self.slot0] > 0).sum())  # sinks + tail (mass 1 while present)
        slots = int(self.counts.sum())
        return local + (raw + slots) * 2 * cfg.n_global_kv_heads * cfg.head_dim * el + slots * self.mass.element_size()

    def slot_tokens(self) -> float:
        """Tokens the stored slots stand for (their masses), summed over the sequences: divided by
        the slots stored, a cell's real merge ratio (an 8-token group with an outlier is 2 slots)."""
        return 0.0 if self.mass is None else float(self.mass[:, self.slot0:].double().sum())

    def stats(self) -> dict[str, list]:
        """Per sequence: 'slots' stored, 'mass' represented (sinks + slots + tail)."""
        if self.counts is None:
            return {"slots": [0] * self.batch_size, "mass": [0.0] * self.batch_size}
        return {"slots": self.counts.tolist(), "mass": [float(x) for x in self.mass.double().sum(dim=1).tolist()]}


class AnchorMassCache(KVCache):
    """One `AnchorMassLayerCache` per layer; `policy` is bound to the budget (slots, per layer and sequence)."""

    def __init__(self, cfg: ModelConfig, batch_size: int, policy: SlotPolicy, device=None, dtype=None):
        scratch = PrefillScratch()
        layers = [AnchorMassLayerCache(cfg, batch_size, policy, device, dtype, scratch)
                  for _ in range(cfg.n_layers)]
        super().__init__(layers, batch_size)
        self.cfg, self.policy, self.budget = cfg, policy, policy.budget

    def force_outliers(self, forced: torch.Tensor) -> None:
        """Evaluation-only oracle (docs/method.md §6 k): every group of the global heads that holds a
        prompt position marked in `forced` [B, P] keeps its first marked token as an exact outlier
        slot. An upper bound on what a better selection rule could keep; never used in training."""
        marks = forced.bool()
        for layer in self.layers:
            layer.forced = marks

