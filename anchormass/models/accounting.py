"""Model-side accounting: parameter counts, analytic KV-cache bytes, FLOPs per token.

The analytic numbers here are what the design implies; `cache.nbytes` (measured) must agree
with them up to the cache's own bookkeeping (preallocated capacity, index tensors).
"""

from __future__ import annotations

import torch
from torch import nn

from anchormass.models.config import ModelConfig


def count_parameters(model: nn.Module) -> int:
    """Parameters the model really holds (works on the meta device)."""
    return sum(p.numel() for p in model.parameters())


def _attention_weights(cfg: ModelConfig) -> int:
    """q and o over the query heads, k and v over the KV heads (grouped-query attention)."""
    return 2 * cfg.d_model * cfg.head_dim * (cfg.n_heads + cfg.kv_heads)


def param_count(cfg: ModelConfig) -> int:
    """Analytic count: embedding + head (one matrix when tied), per layer q/k/v/o + SwiGLU + 2 norms
    (+ the learned outlier scorer, one vector per global KV head), final norm."""
    d = cfg.d_model
    per_layer = _attention_weights(cfg) + 3 * d * cfg.ffn_dim + 2 * d
    if cfg.arch == "anchormass" and cfg.outlier_scorer == "learned":
        per_layer += cfg.n_global_kv_heads * cfg.head_dim
    n_vocab_mats = 1 if cfg.tie_embeddings else 2
    return n_vocab_mats * cfg.vocab_size * d + cfg.n_layers * per_layer + d


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype = torch.bfloat16) -> int:
    """K and V of every KV head of every layer for one raw token: the Standard cache's cost per token."""
    return 2 * cfg.n_layers * cfg.kv_heads * cfg.head_dim * _itemsize(dtype)


def kv_bytes_session(cfg: ModelConfig, seq_len: int, budget: int | None = None,
                     dtype: torch.dtype = torch.bfloat16, mass_dtype: torch.dtype = torch.float32) -> int:
    """Analytic cache bytes after a session of `seq_len` tokens (batch 1).

    Standard: every token (or `budget` tokens per head when a KV policy caps it).
    AnchorMass, per layer: local ring (last `window` tokens, local heads) + sinks + slots
    (worst case 16 per completed block, capped at `budget`, each with one mass) + raw tail,
    the last three over the global heads. Heads here are KV heads (grouped-query attention stores
    one K/V per group of query heads).
    """
    if cfg.arch == "standard":
        kept = seq_len if budget is None else min(seq_len, budget)
        return kept * kv_bytes_per_token(cfg, dtype)
    budget = cfg.slot_budget if budget is None else budget
    b = _itemsize(dtype)
    local_tok = 2 * cfg.n_local_kv_heads * cfg.head_dim * b
    global_tok = 2 * cfg.n_global_kv_heads * cfg.head_dim * b
    n_sink = min(cfg.n_sinks, seq_len)
    n_blocks, tail = divmod(seq_len - n_sink, cfg.block_size)
    slots = min(budget, cfg.slots_per_block * n_blocks)
    per_layer = (min(cfg.window, seq_len) * local_tok + n_sink * global_tok
                 + slots * (global_tok + _itemsize(mass_dtype)) + tail * global_tok)
    return cfg.n_layers * per_layer


def mean_keys_per_query(cfg: ModelConfig, seq_len: int) -> float:
    """Keys a query attends to, summed over (query) heads and averaged over positions 0..seq_len-1.

    AnchorMass counts the fixed parallel layout (16 slots per earlier block, absent outliers
    included, since the kernels compute them too).
    """
    t = torch.arange(seq_len, dtype=torch.float64)
    if cfg.arch == "standard":
        return cfg.n_heads * float((t + 1).mean())
    local = torch.clamp(t + 1, max=cfg.window)
    s, c = cfg.n_sinks, cfg.block_size
    rel = (t - s).clamp_min(0)
    blk, off = torch.div(rel, c, rounding_mode="floor"), rel % c
    glob = torch.where(t < s, t + 1, s + cfg.slots_per_block * blk + off + 1)
    return float(cfg.n_local_heads * local.mean() + cfg.n_global_heads * glob.mean())


def estimate_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token at `seq_len`, for MFU logging.

    6 per weight of every matmul (the embedding lookup is not a matmul; the LM head is) plus
    attention: 2 matmuls x 2 FLOPs x head_dim per visible key, x3 for backward (12 * D * keys).
    """
    d = cfg.d_model
    # The LM head is a matmul whether or not it shares the embedding's matrix.
    matmul_params = cfg.n_layers * (_attention_weights(cfg) + 3 * d * cfg.ffn_dim) + cfg.vocab_size * d
    attn = 12 * cfg.n_layers * cfg.head_dim * mean_keys_per_query(cfg, seq_len)
    return 6 * matmul_params + attn
