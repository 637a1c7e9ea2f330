"""Grouped-query attention in the kernels, both caches and the KV policies (docs/method.md §2, §3):
K/V stored per KV head, each shared by its group of query heads; policies score a KV head by the
MEAN over its group's query heads (kvpress's convention), tested where the max would differ."""

import os

import pytest
import torch
from _gqa_helpers import gqa_config
from test_anchormass_cache import run_chunks

from anchormass.cache import make_cache
from anchormass.cache.kv_policies import H2O, SnapKV, StreamingLLM, attention_probs
from anchormass.cache.standard_cache import StandardLayerCache
from anchormass.models.accounting import kv_bytes_session
from anchormass.models.attention_anchormass import AnchorMassAttention
from anchormass.models.attention_base import repeat_kv
from anchormass.models.reference import reference_anchormass_attention

# Short blocks and windows: a few hundred tokens cross many blocks; 2 KV heads per role.
ODD = gqa_config("anchormass", window=5, block_size=16, group_size=4, n_sinks=3, prefill_chunk=32)


def qkv(cfg, batch, t, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, cfg.n_heads, t, cfg.head_dim, generator=g)
    k, v = (torch.randn(batch, cfg.kv_heads, t, cfg.head_dim, generator=g) for _ in range(2))
    v[:, :, ::7] *= 4.0  # norm outliers: groups emit outlier slots
    return q, k, v


# ----------------------------------------------------------------------------- AnchorMass
@pytest.mark.parametrize("changes", [{}, {"n_local_heads": 0, "n_global_heads": 8}, {"n_kv_heads": 2},
                                     {"n_kv_heads": 2, "n_local_heads": 4, "n_global_heads": 4, "outliers": False}])
def test_block_sdpa_and_cache_equal_the_reference(changes):
    cfg = ODD.replace(attn_impl="block_sdpa", **changes)
    q, k, v = qkv(cfg, 2, 150, seed=1)
    want = reference_anchormass_attention(q, k, v, cfg)
    got = AnchorMassAttention(cfg, layer_idx=0).parallel_attention(q, k, v)
    assert (got - want).abs().max().item() <= 1e-5
    for chunk in (1, 9, 1000):
        cache = make_cache(cfg, batch_size=2)
        assert (run_chunks(cache.layers[0], q, k, v, chunk) - want).abs().max().item() <= 1e-5, chunk
        assert cache.layers[0].glob_k.shape[1] == cfg.n_global_kv_heads  # stored per KV head


def test_stored_bytes_count_kv_heads_and_stage2_runs_per_kv_head():
    cfg = ODD
    q, k, v = qkv(cfg, 1, 200, seed=2)
    cache = make_cache(cfg, batch_size=1, budget=64)
    for layer in cache.layers:
        layer.attend(q, k, v)
    cache.advance(200)
    slots = int(cache.layers[0].counts.max())
    assert cache.stored_nbytes == kv_bytes_session(cfg, 200, budget=slots, dtype=torch.float32)
    mha = make_cache(cfg.replace(n_kv_heads=None), batch_size=1, budget=64)
    for layer in mha.layers:
        layer.attend(q, repeat_kv(k, 2), repeat_kv(v, 2))
    mha.advance(200)
    # K/V halve with 2 query heads per KV head; the fp32 slot masses (one per slot, 2 layers) do not
    assert 2 * cache.stored_nbytes - mha.stored_nbytes == 2 * slots * 4
    # stage 2 (the budget is below the 16 slots per block of 200 tokens' 12 blocks): per KV head
    small = make_cache(cfg, batch_size=1, budget=16)
    run_chunks(small.layers[0], q, k, v, 50)
    assert int(small.layers[0].counts.max()) <= 16 and small.layers[0].stats()["mass"] == [200.0]


# ----------------------------------------------------------------------------- KV policies
B, H, H_KV, D = 2, 4, 2, 8


def test_attention_probs_are_per_query_head_over_the_shared_keys():
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(B, H, 5, D, generator=g), torch.randn(B, H_KV, 12, D, generator=g)
    got = attention_probs(q, k, first_query_slot=7)
    torch.testing.assert_close(got, attention_probs(q, repeat_kv(k, 2), first_query_slot=7))


def _designed_group(prefix_probs_a, prefix_probs_b):
    """One KV head shared by query heads a and b, keys one-hot scaled so a query's logits are its
    own entries: q[h, j] = log p_h(j). The last key is the observation window's own token."""
    probs = torch.tensor([prefix_probs_a, prefix_probs_b], dtype=torch.float64)  # [2, L]
    length = probs.shape[1]
    keys = torch.eye(length, dtype=torch.float64) * length ** 0.5  # logit = q . k / sqrt(D) = q_j
    q = probs.log()  # [2, L]
    return q[None, :, None, :].float(), keys[None, None].float()  # q [1, 2, 1, L], k [1, 1, L, L]


# Query head a puts 0.6 on token 0, 0.3 on token 1; head b 0.0 on token 0 (ε), 0.5 on token 1.
# Mean over the group: token 1 (0.4) beats token 0 (0.3); the max would keep token 0 (0.6 > 0.5).
HEAD_A = [0.6, 0.3, 0.05, 0.05]
HEAD_B = [1e-6, 0.5, 0.25, 0.25 - 1e-6]


def test_snapkv_votes_the_mean_over_the_group():
    q, k = _designed_group(HEAD_A, HEAD_B)
    policy = SnapKV(window=1, kernel=1).bind(2)  # keep 1 prefix token + the window
    per_query = attention_probs(q, k, first_query_slot=3)[..., :3].sum(dim=2)  # [1, 2, 3]
    assert per_query.max(dim=1).values.argmax().item() == 0  # what a max over the group would keep
    assert policy.select(q, k)[0, 0].tolist() == [1, 3]  # the mean keeps token 1
    # and in general: the KV head's vote is the mean of the votes its query heads would cast alone
    g = torch.Generator().manual_seed(4)
    qr, kr = torch.randn(B, H, 4, D, generator=g), torch.randn(B, H_KV, 20, D, generator=g)
    pooled = SnapKV(window=4, kernel=3).bind(8)
    per_head = pooled.votes(qr, repeat_kv(kr, 2))  # [B, H, 16]
    torch.testing.assert_close(pooled.votes(qr, kr), per_head.view(B, H_KV, 2, 16).mean(2))


def test_h2o_scores_the_mean_over_the_group():
    # 4 tokens, each query attending (almost) only to itself, so every token starts at score ~1 in
    # both query heads; then one query per head with the designed probabilities over those 4 + itself.
    eye = torch.eye(5) * 5 ** 0.5  # key j one-hot: a query's logits are its own entries
    prefill_q = (30.0 * torch.eye(5)[:4])[None, None].expand(1, 2, 4, 5)
    last_q = torch.tensor([HEAD_A + [0.01], HEAD_B[:3] + [HEAD_B[3] - 0.01, 0.01]]).log()[None, :, None]
    layer = StandardLayerCache(1, 5, 1, H2O(heavy=1, recent=1).bind(2))
    layer.attend(prefill_q, eye[None, None, :4], eye[None, None, :4])
    layer.attend(last_q, eye[None, None, 4:], eye[None, None, 4:])
    q_all = torch.cat([prefill_q, last_q], dim=2)
    per_query_head = attention_probs(q_all, eye[None, None], first_query_slot=0).sum(dim=2)[0]  # [2, 5]
    torch.testing.assert_close(layer.aux["h2o_score"][0, 0, :5], per_query_head.mean(dim=0))
    assert per_query_head.max(dim=0).values[:4].argmax().item() == 0  # what a max over the group would keep
    layer.after_forward()  # 5 > budget 2: one heavy hitter among tokens 0..3, then the recent token 4
    assert layer.positions()[0, 0].tolist() == [1, 4]  # the mean keeps token 1


def test_streaming_llm_keeps_per_kv_head():
    g = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(B, H, 20, D, generator=g), *(torch.randn(B, H_KV, 20, D, generator=g) for _ in range(2))
    layer = StandardLayerCache(H_KV, D, B, StreamingLLM(sinks=2).bind(6))
    run_chunks(layer, q, k, v, 7)
    assert layer.positions().shape == (B, H_KV, 6)
    assert (layer.positions() == torch.tensor([0, 1, 16, 17, 18, 19], dtype=torch.int32)).all()


@pytest.mark.slow
@pytest.mark.skipif(not (torch.cuda.is_available() or os.environ.get("ANCHORMASS_TEST_FLEX")),
                    reason="FlexAttention costs ~14 s on 2 CPU cores even uncompiled (measured); runs on CUDA "
                           "(compiled), or on CPU with ANCHORMASS_TEST_FLEX=1 (eager)")
def test_flex_kernel_shares_kv_heads_like_the_reference():
    """FlexAttention with enable_gqa, both head roles, forward and (on CUDA) backward."""
    from anchormass.models.kernels.flex import FlexKernel

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = ODD.replace(attn_impl="flex")
    q, k, v = qkv(cfg, 1, 60, seed=6)
    want = reference_anchormass_attention(q, k, v, cfg)
    attn = AnchorMassAttention(cfg, layer_idx=0)
    attn.kernel = FlexKernel(cfg, compiled=device == "cuda")
    q, k, v = (x.to(device).requires_grad_(device == "cuda") for x in (q, k, v))
    got = attn.parallel_attention(q, k, v)
    assert (got.detach().cpu() - want).abs().max().item() <= 1e-5
    if device == "cuda":  # gradients reach the shared KV heads from every query head of their group
        got.square().sum().backward()
        assert k.grad.shape == k.shape and torch.isfinite(k.grad).all() and k.grad.abs().sum() > 0
