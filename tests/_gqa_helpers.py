"""Tiny grouped-query configs for tests: 8 query heads of 16 over 4 KV heads (pairs of query heads
share one), tied embeddings; AnchorMass with 4 local + 4 global query heads (2 KV heads each)."""

from anchormass.models.config import ModelConfig, load_model_config

GQA = dict(n_heads=8, head_dim=16, n_kv_heads=4, n_local_heads=4, n_global_heads=4, tie_embeddings=True,
           vocab_size=1000)


def gqa_config(arch: str, **changes) -> ModelConfig:
    """`<arch>_tiny` with GQA and tied embeddings (plus `changes`)."""
    return load_model_config(f"{arch}_tiny").replace(name=f"{arch}_tiny_gqa", **{**GQA, **changes})
