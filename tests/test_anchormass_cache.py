"""AnchorMass cache attention == the dense docs/method.md §2.2 oracle, chunk by chunk; buffers and accounting."""

import pytest
import torch

from anchormass.cache import make_cache
from anchormass.errors import ConfigError
from anchormass.models.accounting import kv_bytes_per_token, kv_bytes_session
from anchormass.models.config import load_model_config
from anchormass.models.reference import reference_anchormass_attention

TINY = load_model_config("anchormass_tiny")
# Window != block, tiny groups, few sinks: catches mix-ups between the constants.
ODD = TINY.replace(window=5, block_size=16, group_size=4, n_sinks=3, prefill_chunk=32)


def qkv(cfg, batch, t, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, batch, cfg.n_heads, t, cfg.head_dim, generator=g)
    v = torch.randn(batch, cfg.n_heads, t, cfg.head_dim, generator=g)
    v[0] = v[0] * 0.05 + 1.0  # sequence 0: near-constant values, few outliers -> per-sequence counts differ
    return q, k, v


def run_chunks(layer, q, k, v, chunk):
    outs = []
    for s in range(0, q.shape[2], chunk):
        piece = slice(s, s + chunk)
        outs.append(layer.attend(q[:, :, piece], k[:, :, piece], v[:, :, piece]))
        layer.after_forward()
    return torch.cat(outs, dim=2)


VARIANTS = {"odd": ODD, "no_mass_bias": TINY.replace(mass_bias=False), "no_outliers": ODD.replace(outliers=False),
            "mean_key": ODD.replace(background_key="mean"),
            "all_global": TINY.replace(n_local_heads=0, n_global_heads=4),
            "no_sinks": ODD.replace(n_sinks=0)}
CASES = ([(TINY, t, chunk) for t in (5, 15, 100, 333) for chunk in (1, 7, 64, 1000)]
         + [(cfg, t, chunk) for cfg in VARIANTS.values() for t in (15, 150) for chunk in (1, 9, 1000)])
IDS = ([f"tiny-{t}-{c}" for t in (5, 15, 100, 333) for c in (1, 7, 64, 1000)]
       + [f"{n}-{t}-{c}" for n in VARIANTS for t in (15, 150) for c in (1, 9, 1000)])


@pytest.mark.parametrize("cfg, t, chunk", CASES, ids=IDS)
def test_cache_attention_matches_reference(cfg, t, chunk):
    q, k, v = qkv(cfg, 2, t, seed=t)
    want = reference_anchormass_attention(q, k, v, cfg)
    cache = make_cache(cfg, batch_size=2)
    got = run_chunks(cache.layers[0], q, k, v, chunk)
    assert (got - want).abs().max().item() <= 1e-5
    stats = cache.layers[0].stats()
    assert stats["mass"] == [float(t)] * 2


def test_sequences_keep_their_own_slot_counts():
    q, k, v = qkv(ODD, 2, 200, seed=1)
    cache = make_cache(ODD, batch_size=2)
    run_chunks(cache.layers[0], q, k, v, 7)
    slots = cache.layers[0].stats()["slots"]
    n_blocks = (200 - ODD.n_sinks) // ODD.block_size
    assert slots[0] < slots[1] <= n_blocks * ODD.slots_per_block and slots[0] >= n_blocks * ODD.groups_per_block


def test_buffers_start_at_final_size_when_one_chunk_exceeds_the_budget_and_grow_only_by_doubling():
    # headroom (16 slots per 16-token chunk) >= budget 8: the first allocation is budget + headroom.
    cfg = ODD.replace(prefill_chunk=16)
    q, k, v = qkv(cfg, 1, 400, seed=2)
    cache = make_cache(cfg, batch_size=1, budget=8)
    layer = cache.layers[0]
    layer.attend(q[:, :, :1], k[:, :, :1], v[:, :, :1])
    cap = layer.slot_mass.shape[1]
    assert cap == layer.full_capacity  # budget + one chunk's headroom: the final size at once
    nbytes = cache.nbytes
    for s in range(1, 100):  # token by token: stage 2 keeps the store within budget, nothing grows
        layer.attend(q[:, :, s:s + 1], k[:, :, s:s + 1], v[:, :, s:s + 1])
        layer.after_forward()
        assert cache.nbytes == nbytes
    layer.attend(q[:, :, 100:], k[:, :, 100:], v[:, :, 100:])  # 300 tokens in one chunk: more than cap
    assert layer.counts.item() > cap and layer.slot_mass.shape[1] in (2 * cap, 4 * cap, 8 * cap)
    layer.after_forward()
    assert layer.counts.item() <= 8 and layer.stats()["mass"] == [400.0]


def test_nbytes_agrees_with_the_accounting_and_ignores_chunk_working_rows():
    cfg = TINY
    cache = make_cache(cfg, batch_size=1, budget=64)
    assert cache.nbytes == 0 and cache.stats() == {"tokens": 0, "slots": [[0], [0]], "mass": [[0.0], [0.0]]}
    q, k, v = qkv(cfg, 1, 90, seed=3)
    for layer in cache.layers:
        layer.attend(q, k, v)
    cache.advance(90)
    layer = cache.layers[0]
    slots = int(layer.counts.max())
    # The independent accounting says what the session stores; the cache may hold more only as
    # preallocated rows (empty slot rows, the rest of the tail block, sink masses), each at most
    # one token's K and V over all heads of a layer.
    stored = kv_bytes_session(cfg, 90, budget=slots, dtype=torch.float32)
    row = kv_bytes_per_token(cfg.replace(n_layers=1), torch.float32)
    spare_rows = layer.capacity - slots + cfg.block_size + cfg.n_sinks
    nbytes = cache.nbytes
    assert stored <= nbytes <= stored + cfg.n_layers * spare_rows * row
    # The chunk's working rows (its raw stream and new slots, past the slot capacity) exist until
    # end_prefill drops them, and nbytes never counted them.
    assert layer.glob_k.shape[2] > layer.slot0 + layer.capacity
    cache.end_prefill()
    # ... and gives back the prefill headroom: decoding needs budget + one block's slots.
    assert layer.glob_k.shape[2] == layer.slot0 + layer.capacity and cache.nbytes < nbytes
    assert layer.capacity == 64 + cfg.slots_per_block
    st = cache.stats()
    assert st["tokens"] == 90 and st["mass"] == [[90.0], [90.0]]
    assert all(cfg.groups_per_block <= s <= cfg.slots_per_block for per_layer in st["slots"] for s in per_layer)


def test_make_cache_rejects_bad_arguments():
    with pytest.raises(ConfigError, match="slot policy"):
        make_cache(TINY, policy="lru")
    with pytest.raises(ConfigError, match="budget"):
        make_cache(TINY, budget=0)
    with pytest.raises(ConfigError, match="batch_size"):
        make_cache(TINY, batch_size=0)
    cache = make_cache(TINY.replace(slot_policy="fifo", slot_budget=128))
    assert cache.budget == 128 and cache.policy.name == "fifo"


def test_bf16_cache_runs_and_stays_close_to_the_fp32_oracle():
    q, k, v = qkv(ODD, 2, 120, seed=4)
    want = reference_anchormass_attention(q, k, v, ODD)
    cache = make_cache(ODD, batch_size=2, dtype=torch.bfloat16)
    got = run_chunks(cache.layers[0], q.bfloat16(), k.bfloat16(), v.bfloat16(), 9)
    assert got.dtype == torch.bfloat16 and cache.layers[0].glob_k.dtype == torch.bfloat16
    assert (got.float() - want).abs().max().item() < 0.1
    tok = run_chunks(cache.layers[0], q[:, :, :1].bfloat16(), k[:, :, :1].bfloat16(), v[:, :, :1].bfloat16(), 1)
    assert torch.isfinite(tok.float()).all()


def test_nbytes_grows_with_the_store_until_the_budget_then_stays_constant():
    cfg = TINY.replace(prefill_chunk=64)  # one chunk adds <= 2 blocks = 32 slots
    budget = 150  # sequence 0 of qkv() stores ~8 slots per block
    cache = make_cache(cfg, batch_size=1, budget=budget)
    layer = cache.layers[0]
    q, k, v = qkv(cfg, 1, 64 * 40, seed=5)
    sizes, counts, caps = [], [], []
    for s in range(0, q.shape[2], 64):
        piece = slice(s, s + 64)
        layer.attend(q[:, :, piece], k[:, :, piece], v[:, :, piece])
        counts.append(int(layer.counts.max()))  # before stage 2
        layer.after_forward()
        sizes.append(cache.nbytes)
        caps.append(layer.capacity)
        assert counts[-1] <= layer.capacity < max(2 * counts[-1], layer.headroom + 1) or layer.capacity == budget + 32
    reached = next(i for i, c in enumerate(counts) if c >= budget)
    growing = sizes[:reached]
    assert growing == sorted(growing) and len(set(growing)) >= 3  # several doublings, never shrinking
    assert sizes[0] < sizes[-1] and caps[0] == 32 < budget / 4  # starts at one chunk's headroom
    assert set(sizes[reached:]) == {sizes[-1]} and layer.capacity == budget + 32  # final size: budget + headroom
    assert len(sizes) - reached >= 10 and layer.stats()["mass"] == [float(q.shape[2])]


def test_layers_sharing_chunk_masks_and_a_dropped_stage_still_match_the_reference():
    # Two layers of one cache share the position-only masks and the bias buffer (repeated piece
    # sizes: the masks must follow the positions, not only the size); each has its
    # own keys (so its own slot counts). Mixed piece sizes grow the stage; end_prefill drops it
    # mid-stream and later multi-token pieces stage again.
    cfg = ODD
    data = [qkv(cfg, 2, 170, seed=20 + i) for i in range(cfg.n_layers)]
    want = [reference_anchormass_attention(q, k, v, cfg) for q, k, v in data]
    cache = make_cache(cfg, batch_size=2)
    outs, s = [[] for _ in data], 0
    for step, n in enumerate([2, 9, 9, 40, 1, 1, 23, 23, 5, 57]):
        for layer, out, (q, k, v) in zip(cache.layers, outs, data):
            piece = slice(s, s + n)
            out.append(layer.attend(q[:, :, piece], k[:, :, piece], v[:, :, piece]))
        cache.advance(n)
        s += n
        if step == 5:
            cache.end_prefill()
            for layer in cache.layers:
                assert layer.glob_k.shape[2] == layer.slot0 + layer.capacity  # no stage rows left
    assert s == 170
    for out, ref in zip(outs, want):
        assert (torch.cat(out, dim=2) - ref).abs().max().item() <= 1e-5
    counts = [layer.counts.tolist() for layer in cache.layers]
    assert counts[0] != counts[1] or counts[0][0] != counts[0][1]  # the layers' stores really differ


def test_prefill_scratch_is_dropped_by_the_first_decode_step_without_end_prefill():
    """Chunk-path stage rows are working memory `nbytes` leaves out, so they must not survive into
    decoding even when the caller never calls end_prefill (plain `model(chunk, cache=cache)` use)."""
    cfg = TINY
    cache = make_cache(cfg, batch_size=1)
    layer = cache.layers[0]
    q, k, v = qkv(cfg, 1, 301, seed=9)
    layer.attend(q[:, :, :300], k[:, :, :300], v[:, :, :300])
    held = layer.glob_k.shape[2]
    stored = layer.slot0 + layer.capacity
    assert held > stored  # the chunk staged its raw stream and new slots past the capacity
    layer.attend(q[:, :, 300:], k[:, :, 300:], v[:, :, 300:])  # one decode step
    assert layer.glob_k.shape[2] == layer.glob_v.shape[2] == stored
    total = sum(t.numel() * t.element_size() for t in (layer.local_k, layer.local_v, layer.glob_k,
                                                        layer.glob_v, layer.mass, layer.counts))
    assert sum(t.numel() * t.element_size() for t in layer.tensors()) == total  # all it holds is counted
