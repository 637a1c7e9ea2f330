"""SnapKV / H2O / StreamingLLM against brute-force references on small random tensors, budgets,
and exactness when nothing is evicted."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from anchormass.cache import new_cache
from anchormass.cache.kv_policies import H2O, POLICIES, SnapKV, StreamingLLM, get_policy
from anchormass.cache.kv_policies.base import attention_probs, attention_received
from anchormass.cache.standard_cache import StandardLayerCache
from anchormass.errors import ConfigError

B, H, D = 2, 3, 8


def random_qkv(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g) for _ in range(3)]


def run(layer, q, k, v, chunks, check=None):
    """Attend chunk by chunk, calling after_forward like the model's cache.advance does."""
    outs, s = [], 0
    for c in chunks:
        outs.append(layer.attend(q[:, :, s:s + c], k[:, :, s:s + c], v[:, :, s:s + c]))
        layer.after_forward()
        s += c
        if check is not None:
            check(layer, s)
    return torch.cat(outs, dim=2)


# ----------------------------------------------------------------------------- brute force
def softmax_row(q, keys):
    logits = [sum(a * b for a, b in zip(q, kk)) / math.sqrt(len(q)) for kk in keys]
    m = max(logits)
    e = [math.exp(x - m) for x in logits]
    return [x / sum(e) for x in e]


def top_chrono(scores, k):
    return sorted(sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k])


def snapkv_reference(q, k, window, kernel, pooling, budget):
    """Per (b, h): list of kept positions, by plain Python loops in float64."""
    L = k.shape[2]
    pre = L - window
    kept = {}
    for b in range(B):
        for h in range(H):
            votes = [0.0] * pre
            for i in range(window):
                t = pre + i  # the query's position; it sees keys 0..t
                probs = softmax_row(q[b, h, t].double().tolist(), k[b, h, : t + 1].double().tolist())
                for j in range(pre):
                    votes[j] += probs[j]
            r = kernel // 2
            if pooling == "max":
                pooled = [max(votes[max(0, j - r): j + r + 1]) for j in range(pre)]
            else:
                pooled = [sum(votes[max(0, j - r): j + r + 1]) / kernel for j in range(pre)]
            kept[b, h] = top_chrono(pooled, budget - window) + list(range(pre, L))
    return kept


# ----------------------------------------------------------------------------- SnapKV
@pytest.mark.parametrize("pooling,kernel,window,chunks", [
    ("max", 7, 4, [30]), ("max", 3, 5, [9, 8, 13]), ("avg", 5, 4, [12, 1, 17]), ("avg", 1, 6, [1] * 30)])
def test_snapkv_selection_equals_brute_force(pooling, kernel, window, chunks):
    q, k, v = random_qkv(30, seed=kernel + window)
    policy = SnapKV(window=window, kernel=kernel, pooling=pooling).bind(12)
    layer = StandardLayerCache(H, D, B, policy)
    run(layer, q, k, v, chunks)
    assert layer.length == 30  # prefill attention is full; compression waits for end_prefill
    layer.end_prefill()
    ref = snapkv_reference(q, k, window, kernel, pooling, 12)
    pos = layer.positions()
    assert pos.shape == (B, H, 12)
    for (b, h), expect in ref.items():
        assert pos[b, h].tolist() == expect
        torch.testing.assert_close(layer.keys()[b, h], k[b, h, expect])
        torch.testing.assert_close(layer.values()[b, h], v[b, h, expect])
    # Heads (and sequences) choose differently: the selection really is per head.
    assert len({tuple(x) for x in ref.values()}) > 1


def test_snapkv_max_pooling_ties_and_clusters():
    policy = SnapKV(window=2, kernel=3, pooling="max").bind(4)
    # One spike at prefix position 5: max-pooling gives 4, 5, 6 the same score; the earlier two win.
    q = torch.zeros(1, 1, 2, 4)
    k = torch.zeros(1, 1, 12, 4)
    q[..., 0] = 10.0
    k[0, 0, 5, 0] = 1.0
    sel = policy.select(q, k)
    assert sel[0, 0].tolist() == [4, 5, 10, 11]


def test_snapkv_no_compression_when_the_prompt_fits():
    q, k, v = random_qkv(20, seed=4)
    layer = StandardLayerCache(H, D, B, SnapKV(window=4).bind(20))
    run(layer, q, k, v, [20])
    layer.end_prefill()
    assert layer.length == 20 and layer.positions()[0, 0].tolist() == list(range(20))
    assert "snapkv_q" not in layer.state


def test_snapkv_decoding_appends_after_compression():
    q, k, v = random_qkv(40, seed=5)
    layer = StandardLayerCache(H, D, B, SnapKV(window=4, kernel=3).bind(10))
    run(layer, q[:, :, :30], k[:, :, :30], v[:, :, :30], [30])
    layer.end_prefill()
    run(layer, q[:, :, 30:], k[:, :, 30:], v[:, :, 30:], [1] * 10)
    assert layer.length == 20
    assert (layer.positions()[:, :, 10:] == torch.arange(30, 40, dtype=torch.int32)).all()


@pytest.mark.parametrize("kwargs,msg", [
    ({"kernel": 4}, "must be odd"), ({"pooling": "median"}, "pooling must be"),
    ({"window": 64}, "must be >= window"), ({"window": 0}, "window must be")])
def test_snapkv_rejects_bad_settings(kwargs, msg):
    with pytest.raises(ConfigError, match=msg):
        SnapKV(**kwargs).bind(32)


# ----------------------------------------------------------------------------- H2O
def h2o_reference(q, k, chunks, heavy, recent):
    """Per (b, h): after each chunk, {position: accumulated score} of the kept tokens."""
    history = []
    state = {(b, h): {} for b in range(B) for h in range(H)}
    s = 0
    for c in chunks:
        for (b, h), kept in state.items():
            for t in range(s, s + c):
                kept[t] = 0.0
            for t in range(s, s + c):
                visible = [p for p in sorted(kept) if p <= t]
                probs = softmax_row(q[b, h, t].double().tolist(), [k[b, h, p].double().tolist() for p in visible])
                for p, pr in zip(visible, probs):
                    kept[p] += pr
            if len(kept) > heavy + recent:
                order = sorted(kept)
                old, new = order[: len(order) - recent], order[len(order) - recent:]
                top = top_chrono([kept[p] for p in old], heavy)
                survivors = [old[i] for i in top] + new
                state[b, h] = kept = {p: kept[p] for p in survivors}
        s += c
        history.append({key: dict(val) for key, val in state.items()})
    return history


@pytest.mark.parametrize("chunks", [[6, 1, 1, 1, 3, 1, 1, 1, 1], [1] * 16, [16]])
def test_h2o_keeps_heavy_plus_recent_with_the_right_scores(chunks):
    q, k, v = random_qkv(sum(chunks), seed=6)
    policy = H2O(heavy=3, recent=4).bind(None)
    assert policy.budget == 7
    ref = h2o_reference(q, k, chunks, 3, 4)
    step = iter(ref)

    def check(layer, seen):
        expect = next(step)
        assert layer.length == min(seen, 7)  # the budget holds after every forward
        pos, score = layer.positions(), layer.aux["h2o_score"][:, :, : layer.length]
        for (b, h), kept in expect.items():
            assert pos[b, h].tolist() == sorted(kept)
            want = torch.tensor([kept[p] for p in sorted(kept)], dtype=torch.float32)
            torch.testing.assert_close(score[b, h], want, atol=1e-5, rtol=1e-5)

    run(StandardLayerCache(H, D, B, policy), q, k, v, chunks, check)


def test_h2o_budget_split_and_errors():
    p = get_policy("h2o", 9)
    assert (p.heavy, p.recent) == (5, 4)
    assert H2O(heavy=2).bind(9).recent == 7
    with pytest.raises(ConfigError, match="heavy \\+ recent = budget"):
        H2O(heavy=2, recent=2).bind(9)
    with pytest.raises(ConfigError, match="budget given twice"):
        H2O(budget=8).bind(9)


# ----------------------------------------------------------------------------- StreamingLLM
@pytest.mark.parametrize("chunks", [[1] * 20, [9, 1, 5, 1, 4]])
def test_streaming_llm_keeps_sinks_plus_recent(chunks):
    q, k, v = random_qkv(sum(chunks), seed=7)

    def check(layer, seen):
        budget = 8
        expect = list(range(seen)) if seen <= budget else list(range(3)) + list(range(seen - 5, seen))
        assert (layer.positions() == torch.tensor(expect, dtype=torch.int32)).all()
        torch.testing.assert_close(layer.keys(), k[:, :, expect])

    run(StandardLayerCache(H, D, B, StreamingLLM(sinks=3).bind(8)), q, k, v, chunks, check)
    with pytest.raises(ConfigError, match="sinks < budget"):
        StreamingLLM(sinks=8).bind(8)


# ----------------------------------------------------------------------------- all policies
def small(name):
    """Each policy by name, with SnapKV's window shrunk to fit these tiny budgets."""
    return SnapKV(window=4, kernel=3) if name == "snapkv" else POLICIES[name]()


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_holds_its_budget(name):
    q, k, v = random_qkv(60, seed=8)
    layer = StandardLayerCache(H, D, B, get_policy(small(name), 16))

    def within_budget(lay, seen):  # SnapKV only compresses at end_prefill
        assert name == "snapkv" or lay.length <= 16

    run(layer, q[:, :, :40], k[:, :, :40], v[:, :, :40], [13, 13, 14], check=within_budget)
    layer.end_prefill()
    assert layer.length == 16
    assert layer.capacity <= 16 + layer.decode_reserve
    run(layer, q[:, :, 40:], k[:, :, 40:], v[:, :, 40:], [1] * 20, check=within_budget)
    if POLICIES[name].bounded:
        assert layer.capacity == 17  # budget + the decoded token; never regrows


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_budget_covering_the_sequence_is_exactly_the_full_cache(name):
    q, k, v = random_qkv(30, seed=9)
    chunks = [11, 9]
    full = StandardLayerCache(H, D, B)
    with_policy = StandardLayerCache(H, D, B, get_policy(small(name), 30))
    outs = []
    for layer in (full, with_policy):
        out = run(layer, q[:, :, :20], k[:, :, :20], v[:, :, :20], chunks)
        layer.end_prefill()
        outs.append(torch.cat([out, run(layer, q[:, :, 20:], k[:, :, 20:], v[:, :, 20:], [1] * 10)], dim=2))
    assert torch.equal(outs[0], outs[1])


# ----------------------------------------------------------------------------- through the model
@pytest.mark.parametrize("spec", ["standard_tiny", "gqa"])
def test_policies_through_the_standard_tiny_model(spec):
    from _gqa_helpers import gqa_config

    from anchormass.models import build_model

    torch.manual_seed(0)
    model = build_model(gqa_config("standard") if spec == "gqa" else spec).eval()  # gqa: 4 KV heads of 8
    ids = torch.randint(0, model.cfg.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))

    def session(policy, budget):
        cache = new_cache(model, batch_size=2, policy=policy, budget=budget)
        with torch.no_grad():
            logits = [model(ids[:, :20], cache=cache), model(ids[:, 20:32], cache=cache)]
            cache.end_prefill()
            logits += [model(ids[:, t:t + 1], cache=cache) for t in range(32, 48)]
        return torch.cat(logits, dim=1), cache

    full, _ = session(None, None)
    with torch.no_grad():
        torch.testing.assert_close(full, model(ids), atol=1e-4, rtol=0)
    for name in sorted(POLICIES):
        same, cache = session(name, 48)  # the budget covers the whole session: nothing is evicted
        assert torch.equal(same, full), name
        assert cache.stats()["slots"] == [[48, 48]] * model.cfg.n_layers
        policy = SnapKV(window=8) if name == "snapkv" else name
        squeezed, cache = session(policy, 16)
        assert not torch.allclose(squeezed[:, 32:], full[:, 32:]), name
        kept = 16 + (16 if name == "snapkv" else 0)  # SnapKV compresses the prompt once, then appends
        assert cache.stats()["slots"] == [[kept, kept]] * model.cfg.n_layers
        assert cache.stats()["mass"] == [[kept, kept]] * model.cfg.n_layers
        cfg = model.cfg  # K and V of the kept tokens per KV head, fp32, 2 sequences
        assert cache.stored_nbytes == cfg.n_layers * 2 * 2 * cfg.kv_heads * kept * cfg.head_dim * 4


@given(tq=st.integers(1, 9), extra=st.integers(0, 12), groups=st.sampled_from([(3, 3), (6, 3), (6, 1)]),
       seed=st.integers(0, 2**16))
@settings(max_examples=40, deadline=None)
def test_attention_received_is_the_column_sum_of_the_probabilities(tq, extra, groups, seed):
    """H2O's in-place scores equal the plain softmax's column sums, wherever the queries sit (GQA too)."""
    h, h_kv = groups
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, h, tq, D, generator=g) * 3, torch.randn(2, h_kv, tq + extra, D, generator=g) * 3
    for first in {extra, max(0, extra - 1) if extra else extra}:  # the last queries sit at the last keys, or before
        if first + tq > tq + extra:
            continue
        want = attention_probs(q, k, first_query_slot=first).sum(dim=2)
        torch.testing.assert_close(attention_received(q, k, first_query_slot=first), want, atol=1e-5, rtol=1e-5)
