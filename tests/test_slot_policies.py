"""Stage-2 policies (docs/method.md §2.6): hand-built slot stores, then random streams through a real cache."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anchormass.cache import make_cache
from anchormass.cache.slot_policies import (
    POLICIES,
    AdaptiveMerge,
    FifoEvict,
    PriorityEvict,
    ScoreMerge,
    UniformMerge,
    get_policy,
    slot_energy,
)
from anchormass.errors import ConfigError
from anchormass.models.config import SLOT_POLICIES, load_model_config


def store(norms, masses=None, hg=1, d=2):
    """A slot store whose slot j has value norm norms[j] (direction varies) and a distinct key."""
    n = len(norms)
    ang = torch.arange(n, dtype=torch.float32)
    direction = torch.stack([ang.cos(), ang.sin()], dim=-1)  # [n, 2]
    values = (direction * torch.tensor(norms, dtype=torch.float32)[:, None]).expand(hg, n, d).clone()
    keys = torch.arange(n * d, dtype=torch.float32).reshape(1, n, d).expand(hg, n, d).clone()
    mass = torch.ones(n) if masses is None else torch.tensor(masses, dtype=torch.float32)
    return keys, values, mass


def test_energy_is_mean_norm_times_log1p_mass():
    _, v, m = store([3.0, 0.5], masses=[1.0, 7.0])
    assert torch.allclose(slot_energy(v, m), torch.tensor([3 * math.log(2), 0.5 * math.log(8)]))


def test_adaptive_merges_the_lowest_energy_pair_energy_weighted():
    k, v, m = store([5.0, 4.0, 0.2, 0.1, 3.0, 6.0])
    k2, v2, m2 = AdaptiveMerge(protect_fraction=0.0, budget=5).reduce(k, v, m)
    assert m2.tolist() == [1, 1, 2, 1, 1]  # pair (2, 3) merged in place, order kept
    e = slot_energy(v, m)
    want_v = (e[2] * v[:, 2] + e[3] * v[:, 3]) / (e[2] + e[3])
    assert torch.allclose(v2[:, 2], want_v)
    assert torch.equal(k2[:, 2], k[:, 2])  # slot 2 has the higher energy
    keep = [0, 1, 4, 5]
    assert torch.equal(k2[:, [0, 1, 3, 4]], k[:, keep]) and torch.equal(v2[:, [0, 1, 3, 4]], v[:, keep])


def test_adaptive_key_of_the_newer_slot_when_it_has_more_energy():
    k, v, m = store([0.1, 0.3, 5.0, 5.0])
    k2, _, m2 = AdaptiveMerge(protect_fraction=0.0, budget=3).reduce(k, v, m)
    assert m2.tolist() == [2, 1, 1] and torch.equal(k2[:, 0], k[:, 1])


def test_adaptive_both_energies_zero_falls_back_to_mass_weights():
    k, v, m = store([0.0, 0.0, 5.0, 5.0], masses=[1.0, 3.0, 1.0, 1.0])
    _, v2, m2 = AdaptiveMerge(protect_fraction=0.0, budget=3).reduce(k, v, m)
    assert m2.tolist() == [4, 1, 1] and torch.isfinite(v2).all() and torch.equal(v2[:, 0], torch.zeros(1, 2))


def test_mass_weighting_option():
    k, v, m = store([1.0, 2.0, 9.0, 9.0], masses=[1.0, 3.0, 1.0, 1.0])
    _, v2, _ = AdaptiveMerge(protect_fraction=0.0, weighting="mass", budget=3).reduce(k, v, m)
    assert torch.allclose(v2[:, 0], (1 * v[:, 0] + 3 * v[:, 1]) / 4)
    _, v3, _ = AdaptiveMerge(protect_fraction=0.0, weighting="energy", budget=3).reduce(k, v, m)
    assert not torch.allclose(v3[:, 0], v2[:, 0])


def test_adaptive_protects_recent_slots_score_merge_does_not():
    norms = [5.0, 6.0, 7.0, 8.0, 9.0, 9.5, 9.9, 0.1, 0.1]  # lowest pair is the newest
    k, v, m = store(norms)
    # budget 8, protect 1/4 -> the 2 newest slots are protected: pair (6, 7) is not a candidate
    _, _, m_ad = AdaptiveMerge(budget=8).reduce(k, v, m)
    assert m_ad.tolist() == [2, 1, 1, 1, 1, 1, 1, 1]
    _, _, m_sm = ScoreMerge(budget=8).reduce(k, v, m)  # candidates: all; pairs (0,1) .. (6,7)
    assert m_sm.tolist() == [1, 1, 1, 1, 1, 1, 2, 1]


def test_uniform_merge_oldest_pairs_mass_weighted_key_of_later_slot():
    k, v, m = store([9.0, 1.0, 0.1, 0.1, 5.0], masses=[1.0, 3.0, 1.0, 1.0, 1.0])
    k2, v2, m2 = UniformMerge(protect_fraction=0.0, budget=4).reduce(k, v, m)
    assert m2.tolist() == [4, 1, 1, 1]
    assert torch.allclose(v2[:, 0], (v[:, 0] + 3 * v[:, 1]) / 4)
    assert torch.equal(k2[:, 0], k[:, 1])


def test_priority_evicts_lowest_energy_candidates():
    k, v, m = store([5.0, 0.2, 4.0, 0.1, 0.05, 0.01])
    # budget 4, protect 1/4 -> 1 protected (slot 5); drop the 2 lowest of slots 0..4: 4 and 3
    k2, v2, m2 = PriorityEvict(budget=4).reduce(k, v, m)
    assert torch.equal(k2, k[:, [0, 1, 2, 5]]) and torch.equal(v2, v[:, [0, 1, 2, 5]]) and m2.sum() == 4


def test_fifo_evicts_oldest():
    k, v, m = store([1.0] * 7)
    k2, _, m2 = FifoEvict(budget=4).reduce(k, v, m)
    assert torch.equal(k2, k[:, 3:]) and m2.tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize("name", ["adaptive", "score_merge", "uniform_merge"])
def test_merges_run_several_rounds_and_conserve_mass(name):
    g = torch.Generator().manual_seed(0)
    n, budget = 100, 8
    k, v = torch.randn(2, n, 4, generator=g), torch.randn(2, n, 4, generator=g)
    m = torch.randint(1, 9, (n,), generator=g).float()
    k2, v2, m2 = get_policy(name, budget).reduce(k, v, m)
    assert m2.shape[0] <= budget and k2.shape == (2, m2.shape[0], 4) and v2.shape == k2.shape
    assert m2.sum() == m.sum() and torch.isfinite(v2).all()


def test_registry_and_config_options():
    assert sorted(POLICIES) == sorted(SLOT_POLICIES) == ["adaptive", "fifo", "priority", "score_merge", "uniform_merge"]
    cfg = load_model_config("anchormass_tiny").replace(merge_weighting="mass", protect_fraction=0.5)
    p = get_policy(None, 64, cfg)
    assert isinstance(p, AdaptiveMerge) and p.weighting == "mass" and p.protect_fraction == 0.5 and p.budget == 64
    assert get_policy("fifo", 64, cfg).n_protected() == 32
    assert get_policy("score_merge", 64, cfg).n_protected() == 0
    with pytest.raises(ConfigError, match="unknown slot policy"):
        get_policy("lru", 64, cfg)
    with pytest.raises(ConfigError, match="weighting"):
        AdaptiveMerge(weighting="norm").bind(8)
    with pytest.raises(ConfigError, match="protect_fraction"):
        FifoEvict(protect_fraction=1.0).bind(8)
    with pytest.raises(ConfigError, match="budget given twice"):
        FifoEvict(budget=8).bind(16)


# ---------------------------------------------------------------- random streams through a cache
MERGES = ("adaptive", "score_merge", "uniform_merge")
SMALL = dict(n_layers=2, d_model=16, n_heads=2, head_dim=8, n_local_heads=1, n_global_heads=1,
             window=8, block_size=16, group_size=4, n_sinks=4, prefill_chunk=48)


def feed(cache, q, k, v):
    for layer in cache.layers:
        layer.attend(q, k, v)


@pytest.mark.parametrize("name", sorted(POLICIES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(budget=st.integers(16, 64), chunks=st.lists(st.integers(1, 48), min_size=1, max_size=12),
       seed=st.integers(0, 2**16), batch=st.integers(1, 2))
def test_policy_over_random_streams(name, budget, chunks, seed, batch):
    cfg = load_model_config("anchormass_tiny").replace(**SMALL)
    cache = make_cache(cfg, batch, policy=name, budget=budget)
    g = torch.Generator().manual_seed(seed)
    n_prot = 0 if name == "score_merge" else int(budget * cfg.protect_fraction)  # docs/method.md §2.6
    conserves = name in MERGES
    fired, nbytes, first_keys = False, None, []
    for t in chunks:
        # Per-sequence value scales: some groups emit outliers, others not -> counts differ.
        scale = torch.rand(batch, 1, t, 1, generator=g) ** 4 * 3
        q, k = torch.randn(2, batch, 2, t, 8, generator=g)
        v = torch.randn(batch, 2, t, 8, generator=g) * scale + 1.0
        first_keys.append(k[:, 1:])
        feed(cache, q, k, v)
        before = [(layer.slot_k.clone(), layer.slot_v.clone(), layer.slot_mass.clone(), layer.counts.clone())
                  for layer in cache.layers]
        cache.advance(t)
        stats = cache.stats()
        for layer, (sk, sv, sm, cnt) in zip(cache.layers, before):
            assert (layer.counts <= budget).all()
            for b in range(batch):
                n0, n1 = int(cnt[b]), int(layer.counts[b])
                fired |= n0 > budget
                if n0 > budget and n_prot:  # the n_prot most recent slots survive untouched
                    assert torch.equal(layer.slot_k[b, :, n1 - n_prot:n1], sk[b, :, n0 - n_prot:n0])
                    assert torch.equal(layer.slot_v[b, :, n1 - n_prot:n1], sv[b, :, n0 - n_prot:n0])
                    assert torch.equal(layer.slot_mass[b, n1 - n_prot:n1], sm[b, n0 - n_prot:n0])
                assert (layer.slot_mass[b, :n1] > 0).all() and (layer.slot_mass[b, n1:] == 0).all()
        seen = torch.cat(first_keys, dim=2)[:, :, :cfg.n_sinks]
        for layer in cache.layers:  # sinks are the first S keys, untouched
            assert torch.equal(layer.glob_k[:, :, :seen.shape[2]], seen)  # the buffer starts with the sinks
        masses = [m for per_layer in stats["mass"] for m in per_layer]
        if conserves or not fired:
            assert all(m == stats["tokens"] for m in masses)
        if nbytes is not None:  # at the budget the buffers have their final size: chunks never grow them
            assert cache.nbytes == nbytes
        if all(int(cnt.max()) >= budget for *_, cnt in before):  # this chunk reached the budget
            nbytes = cache.nbytes
    if fired and not conserves:
        assert any(m < stats["tokens"] for m in masses)
