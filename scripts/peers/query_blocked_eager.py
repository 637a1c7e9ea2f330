"""Transformers' eager attention computed a block of query rows at a time, for presses that read the weights.

kvpress's ObservedAttention scores a key by the attention weights the prefill gave it, and only the
eager kernel returns those weights. Transformers' eager kernel materialises the whole [B, H, Q, K]
logits several times over (the product, the scaled copy, the masked copy, the softmax) and a
[Q, K] mask beside them: at 16,384 tokens with 9 heads in fp32 that is about 10 GB per copy, which
does not fit twice on a 24 GB machine. This kernel returns the same weights and output with one
[B, H, Q, K] tensor (the weights the caller asked for) and a block of rows for scratch:

- each query row's softmax depends on its own row only, so rows can be computed in any grouping;
- under the causal mask a row never sees keys past its own position, so a block of rows computes
  logits only up to its last row's key and leaves the rest of the weights exactly zero (what the
  eager kernel's softmax gives them: exp of the mask's minimum float underflows to 0).

The logits are computed in fp32 (the runner's dtype; for a bf16 model eager would round them to bf16
first). It is causal only (no padding mask, no sliding window): the runner feeds one unpadded prompt per
forward, and the kernel refuses a mask it would have to honour. With a cache, the K - Q keys before
the queries are the past and every query sees them (a decoding step sees the whole cache).

Runs in kvpress's environment and the project's alike: it needs torch only, and the caller registers
it with `transformers.AttentionInterface.register(NAME, make_kernel(...))`.
"""

from __future__ import annotations

import math

import torch

NAME = "query_blocked_eager"
BLOCK_BYTES = 1 << 28  # fp32 logits of one block of query rows (256 MiB), reused by every block


def rows_per_block(batch: int, heads: int, keys: int) -> int:
    """Query rows whose [B, H, rows, K] fp32 logits fit in BLOCK_BYTES (at least one)."""
    return max(1, BLOCK_BYTES // (batch * heads * keys * 4))


def make_kernel(reuse_weights: bool = False):
    """The attention function to register. With `reuse_weights`, every call returns its weights in one
    buffer kept between calls (a view of its first elements), so a caller must be done with a call's
    weights before the next call: true of a forward hook that scores and drops them, false of a model
    asked to return every layer's attentions. Mapping 10 GB of fresh pages per layer costs more time
    here (about 13 s at 16K) than the layer's arithmetic."""
    kept: list[torch.Tensor] = []

    def weights_buffer(like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        numel = math.prod(shape)
        if not reuse_weights:
            return like.new_empty(shape)
        if not kept or kept[0].numel() < numel or kept[0].dtype != like.dtype or kept[0].device != like.device:
            kept[:] = [like.new_empty(numel)]
        return kept[0][:numel].view(shape)

    # transformers passes dropout and scaling by name; kvpress's attention patch passes dropout by
    # position, after the mask, as transformers' SDPA function orders them
    def kernel(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        return query_blocked_eager(module, query, key, value, attention_mask, scaling, dropout,
                                   weights=weights_buffer(query, (*query.shape[:3], key.shape[2])))

    return kernel


def query_blocked_eager(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, scaling: float | None, dropout: float = 0.0,
                        weights: torch.Tensor | None = None, **kwargs):
    """(output [B, Q, H, D], weights [B, H, Q, K]) as transformers' eager attention gives them, causal;
    `weights`, if given, is the [B, H, Q, K] tensor to write them into (every element is written)."""
    if attention_mask is not None:
        raise ValueError(f"{NAME} is causal only and takes no attention mask")
    if dropout and module.training:
        raise ValueError(f"{NAME} is for inference: no attention dropout")
    batch, heads, n_q, dim = query.shape
    kv_heads, n_k = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    # query head h reads KV head h // groups, as transformers' repeat_kv lays them out
    # (in fp32 once, not per block: a no-op for an fp32 model, a whole copy per block for bf16)
    keys = key[:, :, None].expand(batch, kv_heads, groups, n_k, dim).reshape(batch, heads, n_k, dim).float()
    values = value[:, :, None].expand(batch, kv_heads, groups, n_k, dim).reshape(batch, heads, n_k, dim)
    scaling = dim**-0.5 if scaling is None else scaling
    past = n_k - n_q  # keys before the first query: every query sees them
    weights = query.new_empty(batch, heads, n_q, n_k) if weights is None else weights
    output = query.new_empty(batch, heads, n_q, dim)
    step = min(n_q, rows_per_block(batch, heads, n_k))
    # One scratch buffer for every block's logits: a fresh 256 MiB tensor per block would be mapped
    # fresh by the C allocator each time, and its page faults cost more than the block's arithmetic.
    scratch = torch.empty(batch * heads * step * n_k, dtype=torch.float32, device=query.device)
    for start in range(0, n_q, step):
        stop = min(n_q, start + step)
        seen = past + stop  # keys visible to the block's last row
        logits = scratch[: batch * heads * (stop - start) * seen].view(batch, heads, stop - start, seen)
        torch.matmul(query[:, :, start:stop].float(), keys[:, :, :seen].transpose(2, 3), out=logits)
        logits.mul_(scaling)
        rows = torch.arange(start, stop, device=query.device)[:, None]
        logits.masked_fill_(torch.arange(seen, device=query.device)[None, :] > rows + past, float("-inf"))
        # softmax in place, row by row as the eager kernel's (each row has its own key at least)
        logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()
        logits.div_(logits.sum(dim=-1, keepdim=True))
        block = logits.to(query.dtype)
        weights[:, :, start:stop, :seen] = block
        weights[:, :, start:stop, seen:] = 0.0
        output[:, :, start:stop] = torch.matmul(block, values[:, :, :seen])
    return output.transpose(1, 2).contiguous(), weights
