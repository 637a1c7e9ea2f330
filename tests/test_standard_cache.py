"""StandardCache (full, no policy): chunked attention equals plain causal attention; storage grows
by doubling during the prefill and by bounded steps while decoding; accounting is measured."""

import pytest
import torch
import torch.nn.functional as F

from anchormass.cache.standard_cache import StandardCache, StandardLayerCache
from anchormass.errors import ConfigError
from anchormass.models.config import load_model_config

B, H, D = 2, 3, 8


def random_qkv(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g) for _ in range(3)]


def feed(layer, q, k, v, chunks):
    outs, s = [], 0
    for c in chunks:
        outs.append(layer.attend(q[:, :, s:s + c], k[:, :, s:s + c], v[:, :, s:s + c]))
        s += c
    assert s == q.shape[2]
    return torch.cat(outs, dim=2)


@pytest.mark.parametrize("chunks", [[23], [5, 1, 1, 7, 3, 6], [1] * 23, [10, 13]])
def test_chunked_attention_matches_causal_reference(chunks):
    q, k, v = random_qkv(23)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    layer = StandardLayerCache(H, D, B)
    out = feed(layer, q, k, v, chunks)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert layer.length == 23 and layer.seen == 23
    torch.testing.assert_close(layer.keys(), k)
    torch.testing.assert_close(layer.values(), v)


def test_batch_elements_are_independent():
    q, k, v = random_qkv(12, seed=1)
    both = feed(StandardLayerCache(H, D, B), q, k, v, [4, 1, 7])
    solo = feed(StandardLayerCache(H, D, 1), q[1:], k[1:], v[1:], [4, 1, 7])
    torch.testing.assert_close(both[1:], solo, atol=1e-6, rtol=1e-6)


def test_capacity_grows_by_doubling_not_per_token():
    q, k, v = random_qkv(100, seed=2)
    layer = StandardLayerCache(H, D, B)
    layer.attend(q[:, :, :10], k[:, :, :10], v[:, :, :10])
    caps = [layer.capacity]
    for i in range(10, 100):
        layer.attend(q[:, :, i:i + 1], k[:, :, i:i + 1], v[:, :, i:i + 1])
        caps.append(layer.capacity)
    distinct = sorted(set(caps))
    assert distinct == [10, 20, 40, 80, 160]  # 4 reallocations for 90 decoded tokens


def test_nbytes_is_measured_and_compacts_after_prefill():
    cfg = load_model_config("standard_tiny")
    cache = StandardCache(cfg, batch_size=2, dtype=torch.bfloat16, decode_reserve=4)
    assert cache.nbytes == 0
    for chunk in (7, 7, 7):
        for layer in cache.layers:
            q = torch.randn(2, cfg.n_heads, chunk, cfg.head_dim)
            layer.attend(q, q, q)
        cache.advance(chunk)
    per_slot = 2 * 2 * cfg.n_heads * cfg.head_dim * 2  # K and V, batch 2, bf16
    assert cache.nbytes == cfg.n_layers * 28 * per_slot  # capacity 7 -> 14 -> 28
    cache.end_prefill()
    assert cache.nbytes == cfg.n_layers * (21 + 4) * per_slot
    stats = cache.stats()
    assert stats["tokens"] == 21 and stats["slots"] == stats["mass"] == [[21, 21]] * cfg.n_layers
    assert cache.layers[0].k.dtype == torch.bfloat16


def test_low_precision_cache_with_fp32_queries():
    q, k, v = random_qkv(9, seed=3)
    layer = StandardLayerCache(H, D, B, dtype=torch.bfloat16)
    out = feed(layer, q, k, v, [4, 5])
    ref = F.scaled_dot_product_attention(q, k.bfloat16().float(), v.bfloat16().float(), is_causal=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_bad_shapes_and_budget_without_policy_are_rejected():
    layer = StandardLayerCache(H, D, B)
    x = torch.randn(B, H + 1, 2, D)
    with pytest.raises(ConfigError, match="standard cache holds"):
        layer.attend(x, x, x)
    cfg = load_model_config("standard_tiny")
    with pytest.raises(ConfigError, match="needs a kv policy"):
        StandardCache(cfg, 1, policy=None, budget=64)
    with pytest.raises(ConfigError, match="unknown kv policy"):
        StandardCache(cfg, 1, policy="lru", budget=64)


def test_decoding_after_prefill_uses_the_reserve_before_growing():
    q, k, v = random_qkv(24, seed=4)
    layer = StandardLayerCache(H, D, B, decode_reserve=4)
    feed(layer, q[:, :, :16], k[:, :, :16], v[:, :, :16], [8, 8])
    assert layer.capacity == 16  # a full buffer: the next token would double it
    layer.end_prefill()
    assert layer.capacity == 20
    feed(layer, q[:, :, 16:20], k[:, :, 16:20], v[:, :, 16:20], [1] * 4)
    assert layer.capacity == 20
    feed(layer, q[:, :, 20:21], k[:, :, 20:21], v[:, :, 20:21], [1])
    assert layer.capacity == 24  # grows by the reserve (20 // 8 is smaller), not by doubling


def test_decode_growth_keeps_nbytes_close_to_the_stored_tokens():
    cfg = load_model_config("standard_tiny")
    reserve = 4
    cache = StandardCache(cfg, batch_size=1, decode_reserve=reserve)
    per_token = cfg.n_layers * 2 * cfg.n_heads * cfg.head_dim * 4  # K and V, fp32

    def step(n):
        for layer in cache.layers:
            x = torch.randn(1, cfg.n_heads, n, cfg.head_dim)
            layer.attend(x, x, x)
        cache.advance(n)

    step(100)
    cache.end_prefill()
    caps = set()
    for _ in range(400):
        step(1)
        stored = cache.seen_tokens
        caps.add(cache.layers[0].capacity)
        # Idle capacity is at most max(reserve, stored / 8) tokens at every step.
        assert stored * per_token <= cache.nbytes <= (stored + max(reserve, stored // 8)) * per_token
    growths = sorted(caps)
    assert len(growths) > 4  # it did grow, in several bounded steps
    assert all(b - a <= max(reserve, a // 8) for a, b in zip(growths, growths[1:]))
