"""generate(): greedy == repeated parallel argmax, sampling filters, eos, streaming callback, batches, policies."""

import math

import numpy as np
import pytest
import torch
from test_equivalence import model  # the shared random-init tiny models

from anchormass.cache import new_cache
from anchormass.errors import ConfigError
from anchormass.inference.generate import generate, prefill, sample_next
from anchormass.models import build_model, load_model_config
from anchormass.models.rope import ntk_base


def prompts(m, batch, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, m.cfg.vocab_size, (batch, length), generator=g)


@torch.no_grad()
def greedy_by_parallel_forward(m, ids, n):
    for _ in range(n):
        ids = torch.cat([ids, m(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[:, -n:]


@pytest.mark.parametrize("name", ["anchormass_tiny", "standard_tiny"])
def test_greedy_with_cache_equals_repeated_parallel_forward(name):
    m = model(name)
    ids = prompts(m, 2, 90)
    budget = 4096 if m.cfg.arch == "anchormass" else None
    got = generate(m, ids, max_new_tokens=6, budget=budget, chunk_size=32)
    assert torch.equal(got, greedy_by_parallel_forward(m, ids, 6))
    # batch 2 == each sequence alone
    assert torch.equal(generate(m, ids[1:], max_new_tokens=6, budget=budget, chunk_size=32), got[1:])


def test_prefill_fixes_the_ntk_base_from_the_whole_prompt():
    m = build_model(load_model_config("anchormass_tiny").replace(original_max_len=32)).eval()
    ids = prompts(m, 1, 70)
    cache = new_cache(m)
    last = prefill(m, ids, cache, chunk_size=16)
    assert cache.rope_base == ntk_base(m.cfg.rope_theta, 70, 32, m.cfg.head_dim) > m.cfg.rope_theta
    with torch.no_grad():
        assert (last - m(ids)[:, -1]).abs().max().item() <= 1e-4
        m(ids[:, :1], cache=cache)  # decoding keeps the session's base
    assert cache.rope_base == ntk_base(m.cfg.rope_theta, 70, 32, m.cfg.head_dim)


@pytest.mark.parametrize("policy", ["adaptive", "score_merge", "uniform_merge", "priority", "fifo"])
def test_every_policy_generates_within_budget(policy):
    m = model("anchormass_tiny")
    ids = prompts(m, 2, 300, seed=3)
    cache = new_cache(m, batch_size=2, policy=policy, budget=16)
    prefill(m, ids, cache, chunk_size=100)
    st = cache.stats()
    assert all(s <= 16 for per_layer in st["slots"] for s in per_layer)
    merged = policy in ("adaptive", "score_merge", "uniform_merge")
    assert all((x == 300) == merged for per_layer in st["mass"] for x in per_layer)
    out = generate(m, ids, max_new_tokens=3, policy=policy, budget=16, chunk_size=100)
    assert out.shape == (2, 3) and out.min() >= 0 and out.max() < m.cfg.vocab_size


@pytest.mark.parametrize("policy", ["snapkv", "h2o", "streaming_llm"])
def test_standard_kv_policies_generate(policy):
    m = model("standard_tiny")
    out = generate(m, prompts(m, 2, 150, seed=4), max_new_tokens=3, policy=policy, budget=48, chunk_size=64)
    assert out.shape == (2, 3) and out.min() >= 0 and out.max() < m.cfg.vocab_size


def kept_positions(cache) -> list[torch.Tensor]:
    """Per layer, the original positions the cache holds, [B, H, L]."""
    return [layer.positions().long() for layer in cache.layers]


def first_to_last(*ranges) -> torch.Tensor:
    return torch.cat([torch.arange(a, b) for a, b in ranges])


@torch.no_grad()
def test_streaming_llm_keeps_the_sinks_and_the_recent_window():
    """docs/method.md §3: after every forward, the first `sinks` positions and the latest budget - sinks."""
    m = model("standard_tiny")
    budget, sinks = 48, 4  # StreamingLLM's default sinks
    ids = prompts(m, 2, 150, seed=4)
    cache = new_cache(m, batch_size=2, policy="streaming_llm", budget=budget)
    last = prefill(m, ids, cache, chunk_size=64)  # evicts after each of the chunks 64, 128, 150
    for n in range(150, 154):
        want = first_to_last((0, sinks), (n - (budget - sinks), n))
        for pos in kept_positions(cache):
            assert pos.shape == (2, m.cfg.n_heads, budget)
            assert (pos == want).all()
        m(last.argmax(-1, keepdim=True), cache=cache)


def prompt_queries_and_keys(m, ids):
    """Per layer (q, k) [B, H, P, D] post-RoPE, from a full (policy-free) cache prefilled in one chunk:
    until its first eviction a policy's cache attends exactly like it."""
    cache = new_cache(m, batch_size=ids.shape[0])
    seen = []
    for layer in cache.layers:
        def spy(q, k, v, attend=layer.attend):
            seen.append((q.float(), k.float()))
            return attend(q, k, v)
        layer.attend = spy
    prefill(m, ids, cache, chunk_size=ids.shape[1])
    return seen


def causal_probs(q, k):
    """fp32 softmax(q k^T / sqrt(D)) with query i (of the last Tq of L positions) seeing keys <= itself."""
    tq, length = q.shape[2], k.shape[2]
    logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    future = torch.arange(length)[None, :] > torch.arange(length - tq, length)[:, None]
    return logits.masked_fill(future, float("-inf")).softmax(dim=-1)


def top_in_order(scores: torch.Tensor, n: int) -> torch.Tensor:
    """The n highest scores' indices per row (ties: the earlier index), ascending; [..., N] -> [..., n]."""
    flat = scores.reshape(-1, scores.shape[-1]).numpy()
    rows = [np.sort(np.lexsort((np.arange(len(r)), -r))[:n]) for r in flat]
    return torch.from_numpy(np.stack(rows)).view(*scores.shape[:-1], n)


@torch.no_grad()
@pytest.mark.parametrize("policy", ["snapkv", "h2o"])
def test_score_policies_keep_the_positions_their_definition_selects(policy):
    """docs/method.md §3, recomputed here from the prompt's queries and keys. H2O (prompt in one chunk):
    the `budget // 2` latest positions plus the older ones with the highest attention column sums.
    SnapKV: the last `window` = 32 positions plus the prefix positions with the highest votes of the
    window queries, max-pooled over 7 neighbours."""
    m = model("standard_tiny")
    budget, p = 48, 150
    ids = prompts(m, 2, p, seed=4)
    cache = new_cache(m, batch_size=2, policy=policy, budget=budget)
    prefill(m, ids, cache, chunk_size=p)
    for pos, (q, k) in zip(kept_positions(cache), prompt_queries_and_keys(m, ids)):
        if policy == "h2o":
            recent = budget // 2
            score = causal_probs(q, k).sum(dim=2)[..., :p - recent]  # [B, H, older]
            heavy = top_in_order(score, budget - recent)
            want = torch.cat([heavy, first_to_last((p - recent, p)).expand(*heavy.shape[:2], recent)], dim=-1)
        else:
            window, kernel = 32, 7
            votes = causal_probs(q[:, :, -window:], k).sum(dim=2)[..., :p - window]  # [B, H, prefix]
            pooled = torch.nn.functional.max_pool1d(votes, kernel, stride=1, padding=kernel // 2)
            top = top_in_order(pooled, budget - window)
            want = torch.cat([top, first_to_last((p - window, p)).expand(*top.shape[:2], window)], dim=-1)
        assert torch.equal(pos, want)


def test_eos_stops_and_pads_finished_sequences_and_callback_streams():
    m = model("anchormass_tiny")
    ids = prompts(m, 2, 40, seed=5)
    free = generate(m, ids, max_new_tokens=5)
    eos = int(free[0, 1])  # sequence 0 ends at step 1
    assert eos not in free[1].tolist() and eos != free[0, 0]  # holds for this seed; keeps the test sharp
    seen = []
    out = generate(m, ids, max_new_tokens=5, eos_id=eos, callback=lambda step, tok: seen.append((step, tok.clone())))
    assert out[0, :2].tolist() == free[0, :2].tolist() and (out[0, 2:] == eos).all()
    assert out.shape == (2, 5) and torch.equal(out[1], free[1])  # sequence 1 runs on
    assert [s for s, _ in seen] == list(range(out.shape[1]))
    assert torch.equal(torch.stack([t for _, t in seen], dim=1), out)
    single = generate(m, ids[:1], max_new_tokens=5, eos_id=eos)  # everything finished: stop early
    assert single.tolist() == [free[0, :2].tolist()]


def test_top_k_and_top_p_filter_the_samples():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(400, 4)
    g = torch.Generator().manual_seed(0)
    k2 = sample_next(logits, temperature=1.0, top_k=2, generator=g)
    assert set(k2.tolist()) == {0, 1}
    p7 = sample_next(logits, temperature=1.0, top_p=0.7, generator=g)  # 0.5 < 0.7 <= 0.8: keep {0, 1}
    assert set(p7.tolist()) == {0, 1}
    p9 = sample_next(logits, temperature=1.0, top_p=0.9, generator=g)
    assert set(p9.tolist()) == {0, 1, 2}
    tiny_p = sample_next(logits, temperature=1.0, top_p=0.01, generator=g)  # the top token always stays
    assert set(tiny_p.tolist()) == {0}
    full = sample_next(logits, temperature=1.0, generator=g)
    assert set(full.tolist()) == {0, 1, 2, 3}


def test_sampling_is_reproducible_with_a_generator():
    m = model("standard_tiny")
    ids = prompts(m, 2, 20)
    run = lambda seed: generate(m, ids, 6, temperature=0.8, top_k=50, top_p=0.95,  # noqa: E731
                                generator=torch.Generator().manual_seed(seed))
    assert torch.equal(run(1), run(1)) and not torch.equal(run(1), run(2))


def test_bad_arguments_are_rejected():
    m = model("anchormass_tiny")
    ids = prompts(m, 1, 4)
    for kwargs, fragment in [(dict(max_new_tokens=-1), "max_new_tokens"), (dict(temperature=-1.0), "temperature"),
                             (dict(top_k=0), "top_k"), (dict(top_p=0.0), "top_p"), (dict(chunk_size=0), "chunk"),
                             (dict(threads=0), "threads")]:
        with pytest.raises(ConfigError, match=fragment):
            generate(m, ids, **{"max_new_tokens": 2, **kwargs})
    assert generate(m, ids, 0).shape == (1, 0)


@pytest.mark.parametrize("name", ["anchormass_tiny", "standard_tiny"])
def test_new_cache_holds_the_autocast_dtype(name):
    """Under GPU-style autocast the cache must hold what attention computes with (bf16), else
    `nbytes` doubles and every step casts; outside autocast it follows the parameters."""
    m = model(name)
    ids = prompts(m, 1, 70)
    cache = new_cache(m)
    with torch.no_grad():
        m(ids, cache=cache)
    fp32_bytes = cache.nbytes
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        cache = new_cache(m)
        m(ids, cache=cache)
    assert {t.dtype for layer in cache.layers for t in layer.tensors() if t.is_floating_point()} >= {torch.bfloat16}
    assert cache.nbytes < fp32_bytes


def test_decode_runs_on_the_requested_cpu_threads_and_restores_them():
    m = model("anchormass_tiny")
    ids = prompts(m, 1, 20)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # a multi-thread default, as on any multi-core machine
    try:
        during = []
        want = generate(m, ids, 4, callback=lambda step, nxt: during.append(torch.get_num_threads()), threads=None)
        assert during == [2] * 4 and torch.get_num_threads() == 2
        during.clear()
        got = generate(m, ids, 4, callback=lambda step, nxt: during.append(torch.get_num_threads()))
        assert during == [1] * 4 and torch.get_num_threads() == 2  # default: 1 thread, restored after
        assert torch.equal(got, want)
    finally:
        torch.set_num_threads(before)
