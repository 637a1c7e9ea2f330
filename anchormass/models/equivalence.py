"""Up to which sequence length two model configs compute the same function (docs/method.md §2.2, §5).

AnchorMass departs from full causal attention in two places only: a local head's window drops
keys older than W tokens, and a global head reads a compressed slot once a whole block lies
before the query's own block. On a sequence of at most min(W, S + C) tokens neither happens
(every local window reaches position 0; every global key is a sink or a raw token of the
query's own block, mass 1, so +log(mass) = 0), and AnchorMass with any head split, group size or
ablation is the Standard model. A curriculum uses this to train a short first stage once for
all its models (`shared: true`, anchormass/curriculum/plan.py); tests/test_same_function.py
measures it.
"""

from __future__ import annotations

from anchormass.models.config import ModelConfig

# Fields that only say how attention is restricted or compressed, or which kernel computes it,
# so none of them acts on a sequence within exact_attention_len. Every other field (shapes,
# init, norms, RoPE) must be equal for two configs to be the same function.
ATTENTION_ONLY_FIELDS = frozenset({
    "name", "arch", "n_local_heads", "n_global_heads", "window", "block_size", "group_size", "n_sinks",
    "slot_budget", "outlier_cos", "outlier_rel_norm", "outliers", "background_key", "mass_bias", "slot_policy",
    "merge_weighting", "protect_fraction", "attn_impl", "prefill_chunk", "activation_checkpointing"})


def exact_attention_len(cfg: ModelConfig) -> float:
    """The longest sequence on which every head attends causally over all earlier tokens, uncompressed:
    unbounded for Standard, min(window, n_sinks + block_size) for AnchorMass."""
    if cfg.arch == "standard":
        return float("inf")
    return float(min(cfg.window, cfg.n_sinks + cfg.block_size))


def same_function_len(a: ModelConfig, b: ModelConfig) -> float:
    """The longest sequence length up to which `a` and `b`, given the same weights, give the same
    logits (0 when they differ in a field that acts at every length)."""
    da, db = a.to_dict(), b.to_dict()
    if any(da[k] != db[k] for k in da if k not in ATTENTION_ONLY_FIELDS):
        return 0.0
    return min(exact_attention_len(a), exact_attention_len(b))
