"""The Standard model's inference cache: dense per-layer K/V, optionally under a KV policy.

Per layer the cache holds K and V as preallocated [B, H_kv, capacity, D] buffers (post-RoPE keys;
H_kv = cfg.kv_heads: with grouped-query attention one K/V per group of query heads, the memory
it saves, and attention shares it with the group's query heads);
a chunk is written in place, so decoding never re-copies the whole cache per token. Capacity:
  prefill   grows by doubling (few copies); `end_prefill` then trims it to length + reserve
  decode    grows by max(decode_reserve, capacity // 8) tokens, so idle capacity stays within
            max(decode_reserve, length / 8) tokens: `nbytes` (measured, used to match budgets
            in the equal-KV-bytes comparison) tracks what is stored to ~12.5%, and a growth
            copies the cache once per ~length / 8 decoded tokens (amortized O(1) per token)
Every KV head of every sequence holds the same number of tokens (`length`);
policies (docs/method.md §3, `kv_policies/`) choose *which* tokens per KV head and sequence.

Attention is always computed by SDPA over the stored keys, whatever the policy: policies that
need attention scores (H2O, the hit-rate probe) compute them separately in fp32. So while a
policy has evicted nothing, its outputs are bit-identical to the full cache's.

Stored slots stay in chronological order (appends go to the end, selections are gathered in
ascending order), so "the first n slots" are the oldest tokens and "the last n" the most recent.
"""

from __future__ import annotations

from typing import Iterable

import torch
import torch.nn.functional as F

from anchormass.cache.base import KVCache, LayerCache
from anchormass.cache.kv_policies import KVPolicy, get_policy
from anchormass.errors import ConfigError

POSITION_AUX = "position"  # per-slot original position (int32), kept when a policy is active


class StandardLayerCache(LayerCache):
    def __init__(self, n_kv_heads: int, head_dim: int, batch_size: int, policy: KVPolicy | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 decode_reserve: int = 64):
        self.n_kv_heads, self.head_dim, self.batch_size = n_kv_heads, head_dim, batch_size
        self.policy = policy
        self.device, self.dtype = device, dtype
        self.decode_reserve = decode_reserve
        self.k: torch.Tensor | None = None  # [B, H_kv, cap, D]
        self.v: torch.Tensor | None = None  # [B, H_kv, cap, D]
        self.length = 0  # tokens stored per KV head
        self.seen = 0  # tokens attended so far (= absolute position of the next token)
        self.prefilling = True
        # Per-slot side tensors [B, H_kv, cap] grown, appended and gathered together with k/v.
        self.aux: dict[str, torch.Tensor] = {}
        # Policy scratch that is not per slot (e.g. SnapKV's observation queries).
        self.state: dict[str, torch.Tensor] = {}
        self._aux_dtypes: dict[str, torch.dtype] = {}
        if policy is not None:
            self.add_aux(POSITION_AUX, torch.int32)

    # ------------------------------------------------------------------ storage
    @property
    def capacity(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def add_aux(self, name: str, dtype: torch.dtype) -> None:
        """Declare a per-slot tensor (zero for newly appended slots; positions are filled in)."""
        self._aux_dtypes[name] = dtype
        if self.k is not None and name not in self.aux:
            self.aux[name] = torch.zeros(self.k.shape[:3], dtype=dtype, device=self.k.device)

    def _reallocate(self, capacity: int) -> None:
        shape = (self.batch_size, self.n_kv_heads, capacity, self.head_dim)
        k = torch.empty(shape, dtype=self.dtype, device=self.device)
        v = torch.empty(shape, dtype=self.dtype, device=self.device)
        aux = {name: torch.zeros(shape[:3], dtype=dt, device=self.device) for name, dt in self._aux_dtypes.items()}
        n = self.length
        if self.k is not None and n:
            k[:, :, :n] = self.k[:, :, :n]
            v[:, :, :n] = self.v[:, :, :n]
            for name, t in self.aux.items():
                aux[name][:, :, :n] = t[:, :, :n]
        self.k, self.v, self.aux = k, v, aux

    def _reserve(self, needed: int) -> None:
        if needed <= self.capacity:
            return
        step = self.capacity if self.prefilling else max(self.decode_reserve, self.capacity // 8)
        capacity = max(needed, self.capacity + step)
        if self.policy is not None and self.policy.bounded:
            # Between forwards a bounded cache holds <= budget tokens: budget + this chunk suffices.
            capacity = min(capacity, max(needed, self.policy.budget + 1))
        self._reallocate(capacity)

    def keep(self, idx: torch.Tensor) -> None:
        """Keep only the stored slots `idx` ([B, H_kv, n], ascending, per KV head and sequence)."""
        b, h, n = idx.shape
        cap = self.capacity
        # Row indices into the flattened [B*H*cap] slot axis: index_select copies whole D-rows,
        # several times faster on CPU than a gather with an index expanded over D.
        rows = (idx + torch.arange(b * h, device=idx.device).view(b, h, 1) * cap).reshape(-1)
        for buf in (self.k, self.v):
            picked = buf.view(b * h * cap, self.head_dim).index_select(0, rows)  # [B*H*n, D]
            buf[:, :, :n] = picked.view(b, h, n, self.head_dim)
        for t in self.aux.values():
            t[:, :, :n] = t.view(-1).index_select(0, rows).view(b, h, n)
        self.length = n

    def compact(self, reserve: int) -> None:
        """Resize the buffers to exactly `length + reserve` slots after the prefill: no idle
        capacity left over from doubling (nbytes stays honest), and room for the first `reserve`
        decoded tokens so decoding does not double a just-filled buffer."""
        if self.k is not None and self.capacity != self.length + reserve:
            self._reallocate(self.length + reserve)

    def keys(self) -> torch.Tensor:
        return self.k[:, :, : self.length]  # [B, H_kv, L, D]

    def values(self) -> torch.Tensor:
        return self.v[:, :, : self.length]  # [B, H_kv, L, D]

    def positions(self) -> torch.Tensor:
        """Original positions of the stored slots, [B, H_kv, L] (only when a policy is active)."""
        return self.aux[POSITION_AUX][:, :, : self.length]

    # ------------------------------------------------------------------ seam
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [B, H, T, D], k, v [B, H_kv, T, D] -> [B, H, T, D]."""
        start = self._store(q, k, v)
        t = k.shape[2]
        keys, vals = self.keys(), self.values()
        if keys.dtype != q.dtype:
            keys, vals = keys.to(q.dtype), vals.to(q.dtype)
        gqa = q.shape[1] != self.n_kv_heads  # each KV head serves its group of query heads
        if t == 1:
            out = F.scaled_dot_product_attention(q, keys, vals, enable_gqa=gqa)  # one query sees everything stored
        elif start == 0:
            out = F.scaled_dot_product_attention(q, keys, vals, is_causal=True, enable_gqa=gqa)
        else:
            # Stored slots are all earlier than the chunk: visible; the chunk itself is causal.
            cols = torch.arange(start + t, device=q.device).unsqueeze(0)
            rows = torch.arange(t, device=q.device).unsqueeze(1) + start
            out = F.scaled_dot_product_attention(q, keys, vals, attn_mask=cols <= rows, enable_gqa=gqa)  # [B, H, T, D]
        self._observe(q)
        return out

    def ingest(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Everything `attend` does to this cache, without computing the attention: for a cache that
        follows another's prefill (shared_prefill.py), whose attention output is the same."""
        self._store(q, k, v)
        self._observe(q)

    def ingest_like(self, twin: "StandardLayerCache", q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """`ingest`, with the policy's per-slot records copied from `twin`, a cache in the same state
        whose policy has the same observation_key and has just ingested this chunk (shared_prefill.py)."""
        self._store(q, k, v)
        for name, buf in twin.aux.items():
            if name not in self.aux:
                self.add_aux(name, buf.dtype)
            self.aux[name][:, :, :self.length] = buf[:, :, :self.length]
        self.seen += q.shape[2]

    def _store(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
        """Append the chunk's k, v (and the slots' positions); returns the first new slot."""
        b, h, t, d = k.shape
        if (b, h, d) != (self.batch_size, self.n_kv_heads, self.head_dim) or q.shape[1] % h:
            raise ConfigError(f"standard cache holds [B={self.batch_size}, H_kv={self.n_kv_heads}, D={self.head_dim}], "
                              f"got k of shape {tuple(k.shape)} for q of shape {tuple(q.shape)}")
        if self.dtype is None:
            self.dtype = k.dtype
        if self.device is None:
            self.device = k.device
        start = self.length
        self._reserve(start + t)
        self.k[:, :, start:start + t] = k
        self.v[:, :, start:start + t] = v
        for name, buf in self.aux.items():
            buf[:, :, start:start + t] = 0
        if POSITION_AUX in self.aux:
            self.aux[POSITION_AUX][:, :, start:start + t] = torch.arange(
                self.seen, self.seen + t, dtype=torch.int32, device=self.device)
        self.length = start + t
        return start

    def _observe(self, q: torch.Tensor) -> None:
        """The policy sees the chunk's queries (after its keys are stored); the position advances."""
        if self.policy is not None:
            self.policy.on_attend(self, q)
        self.seen += q.shape[2]

    def after_forward(self) -> None:
        if self.policy is not None:
            self.policy.after_forward(self)

    def end_prefill(self) -> None:
        if not self.prefilling:
            return  # idempotent: a driver and a caller may both signal the end of the prompt
        if self.policy is not None:
            self.policy.end_prefill(self)
        self.prefilling = False
        bounded = self.policy is not None and self.policy.bounded
        self.compact(1 if bounded else self.decode_reserve)

    def tensors(self) -> Iterable[torch.Tensor]:
        if self.k is not None:
            yield self.k
            yield self.v
        yield from self.aux.values()
        yield from self.state.values()

    def stored_nbytes(self) -> int:
        """K and V of the `length` tokens kept per KV head and sequence."""
        if self.k is None:
            return 0
        return 2 * self.batch_size * self.n_kv_heads * self.length * self.head_dim * self.k.element_size()

    def stats(self) -> dict[str, list[int]]:
        """Per sequence (every sequence keeps the same number of tokens): 'slots', 'mass'."""
        return {"slots": [self.length] * self.batch_size, "mass": [self.length] * self.batch_size}


class StandardCache(KVCache):
    """`make_cache` builds this for `cfg.arch == "standard"`.

    policy: None (full cache), a name in `kv_policies.POLICIES` or a `KVPolicy` instance;
    budget: tokens kept per KV head (required with a policy). Positions stay the original ones
    (keys are stored post-RoPE), for every policy.
    """

    def __init__(self, cfg, batch_size: int, policy: str | KVPolicy | None = None, budget: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 decode_reserve: int = 64):
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        bound = get_policy(policy, budget)
        self.policy = bound
        layers = [StandardLayerCache(cfg.kv_heads, cfg.head_dim, batch_size, bound, device, dtype, decode_reserve)
                  for _ in range(cfg.n_layers)]
        super().__init__(layers, batch_size)
