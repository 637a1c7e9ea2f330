"""docs/method.md §2.1/§2.2 attention with compiled FlexAttention: a block mask for visibility, a
score_mod for log(mass).

Global keys are laid out as [sinks | every slot | raw tokens S..T-1]; the block mask encodes
"sink at or before t", "slot of a block before t's block" and "raw token of t's block at or
before t" by index arithmetic only, so it does not depend on the batch or the layer: it is
built once per (length, layout, device), kept in `_BLOCK_MASKS` and shared by every layer and
step. Mass-0 slots are removed by the score_mod (-inf), which adds log(mass) in fp32. Same
numbers as `block_sdpa`; GPU forward + backward, CPU forward only (torch 2.13 has no CPU
FlexAttention backward).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from anchormass.errors import ConfigError
from anchormass.models.config import ModelConfig
from anchormass.models.kernels.block_sdpa import is_gqa
from anchormass.models.kernels.layout import global_slots

# One compiled graph per sequence length. Evaluation runs many lengths; past the recompile
# limit dynamo would fall back to eager flex, which materialises the whole score matrix.
torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
compiled_flex = torch.compile(flex_attention, dynamic=False)

# (kind, length, layout numbers, device) -> BlockMask. Bounded: an evaluation sweeps many lengths.
_BLOCK_MASKS: OrderedDict[tuple, BlockMask] = OrderedDict()
MAX_CACHED_MASKS = 64


@torch.compiler.disable
def _build(key: tuple, compiled: bool = True) -> BlockMask:
    """Build (outside any traced graph: it compiles its own) and remember the mask for `key`."""
    kind, t, device = key[0], key[1], key[-1]
    if kind == "local":
        window = key[2]

        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx) & (q_idx - kv_idx < window)

        n_kv = t
    else:
        n_sinks, block_size, slots_per_block = key[2:5]
        n_sink = min(n_sinks, t)
        n_slots = (t - n_sink) // block_size * slots_per_block

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

        n_kv = t + n_slots
    mask = create_block_mask(mask_mod, None, None, t, n_kv, device=device, _compile=compiled)
    _BLOCK_MASKS[key] = mask
    while len(_BLOCK_MASKS) > MAX_CACHED_MASKS:
        _BLOCK_MASKS.popitem(last=False)
    return mask


def block_mask(key: tuple, compiled: bool = True) -> BlockMask:
    mask = _BLOCK_MASKS.get(key)
    return _build(key, compiled) if mask is None else mask


def local_key(t: int, cfg: ModelConfig, device: torch.device) -> tuple:
    return ("local", t, cfg.window, str(device))


def global_key(t: int, cfg: ModelConfig, device: torch.device) -> tuple:
    return ("global", t, cfg.n_sinks, cfg.block_size, cfg.slots_per_block, str(device))


class FlexKernel:
    """The FlexAttention kernel of one attention module (see kernels/__init__.py).

    compiled=False runs FlexAttention eagerly (it then materialises the full score matrix): for
    checks at tiny sizes on machines where compiling costs more than the check.
    """

    def __init__(self, cfg: ModelConfig, compiled: bool = True):
        self.cfg = cfg
        self.compiled = compiled
        self._attend = compiled_flex if compiled else flex_attention

    @staticmethod
    def _check_trainable(q: torch.Tensor) -> None:
        if q.device.type != "cuda" and torch.is_grad_enabled() and q.requires_grad:
            raise ConfigError("attn_impl='flex' has no backward on CPU (torch 2.13); "
                              "use attn_impl='block_sdpa' for CPU training")

    def local_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self._check_trainable(q)
        mask = block_mask(local_key(q.shape[2], self.cfg, q.device), self.compiled)
        return self._attend(q, k, v, block_mask=mask, enable_gqa=is_gqa(q, k))

    def global_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         scorer: torch.Tensor | None = None) -> torch.Tensor:
        self._check_trainable(q)
        b, _, t, _ = q.shape
        n_sink, slot_k, slot_v, slot_lm = global_slots(k, v, self.cfg, scorer)
        n_slots = slot_lm.shape[1]
        keys = torch.cat([k[:, :, :n_sink], slot_k, k[:, :, n_sink:]], dim=2)  # [B, Hg_kv, T + n_slots, D]
        vals = torch.cat([v[:, :, :n_sink], slot_v, v[:, :, n_sink:]], dim=2)
        bias = torch.zeros(b, t + n_slots, device=q.device, dtype=torch.float32)
        bias[:, n_sink:n_sink + n_slots] = slot_lm  # [B, Kn]: log(mass) on slots, 0 on raw keys

        def score_mod(score, b_idx, h_idx, q_idx, kv_idx):
            return score + bias[b_idx, kv_idx]

        mask = block_mask(global_key(t, self.cfg, q.device), self.compiled)
        return self._attend(q, keys, vals, score_mod=score_mod, block_mask=mask, enable_gqa=is_gqa(q, k))
