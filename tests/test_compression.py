import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from anchormass.models.compression import compress_blocks, group_decisions
from anchormass.models.config import load_model_config

G = 8


def _cfg(**changes):
    # Two groups per block so slot order across groups is exercised too.
    return load_model_config("anchormass_tiny").replace(block_size=16, group_size=8, **changes)


def _keys(n, h=2, d=4):
    # Distinct, recognisable keys: key of token i, head j = (100*j + i) in every dimension.
    idx = (torch.arange(n, dtype=torch.float32)[None, :, None]
           + 100 * torch.arange(h, dtype=torch.float32)[:, None, None])
    return idx.expand(h, n, d).clone()[None]  # [1, H, n, D]


def _values(rows):
    """rows: list of G vectors (shared by both heads) for one group -> [1, 2, G, D]."""
    v = torch.tensor(rows, dtype=torch.float32)
    return v[None, None].expand(1, 2, G, v.shape[-1]).clone()


E1, E2 = [1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]


def _two_groups(first, second):
    return torch.cat([_values(first), _values(second)], dim=2)  # [1, 2, 16, D]


def _calm():
    return [[1.0 + 0.05 * i, 0.0, 0.0, 0.0] for i in range(G)]


def test_no_outlier_gives_one_slot_of_mass_8():
    v = _two_groups(_calm(), _calm())
    k = _keys(16)
    sk, sv, sm = compress_blocks(k, v, _cfg())
    assert sm.tolist() == [[8.0, 0.0, 8.0, 0.0]]
    assert torch.allclose(sv[0, 0, 0], v[0, 0, :8].mean(0))
    assert torch.equal(sk[0, :, 0], k[0, :, 7])  # anchor = last token of group 0
    assert torch.equal(sk[0, :, 2], k[0, :, 15])  # anchor of group 1
    assert sv[0, :, 1].abs().sum() == 0 and sk[0, :, 1].abs().sum() == 0  # absent outlier slot


def test_outlier_by_direction():
    rows = [E1] * G
    rows[3] = E2
    v = _two_groups(rows, _calm())
    k = _keys(16)
    idx, emit = group_decisions(v, _cfg())
    assert emit.tolist() == [[True, False]] and idx[0, 0].item() == 3
    sk, sv, sm = compress_blocks(k, v, _cfg())
    assert sm.tolist() == [[7.0, 1.0, 8.0, 0.0]]
    assert torch.allclose(sv[0, :, 0], torch.tensor(E1).expand(2, 4))  # mean of the other 7
    assert torch.equal(sv[0, :, 1], v[0, :, 3]) and torch.equal(sk[0, :, 1], k[0, :, 3])
    assert torch.equal(sk[0, :, 0], k[0, :, 7])


def test_outlier_by_norm_alone():
    # Token 5 is 3x longer and a little off-direction: it is the argmin of sim, but its
    # cosine (~0.95) is above 0.85, so only the relative-norm test (~2.6 > 2) fires.
    rows = [E1] * G
    rows[5] = [3.0, -1.5, 0.0, 0.0]
    v = _two_groups(_calm(), rows)
    idx, emit = group_decisions(v, _cfg())
    assert emit.tolist() == [[False, True]] and idx[0, 1].item() == 5
    _, _, sm = compress_blocks(_keys(16), v, _cfg())
    assert sm.tolist() == [[8.0, 0.0, 7.0, 1.0]]
    # Same values with the norm threshold raised: nothing fires.
    _, emit = group_decisions(v, _cfg(outlier_rel_norm=3.0))
    assert not emit.any()


def test_anchor_skips_an_outlier_in_last_position():
    rows = [E1] * G
    rows[7] = E2
    v, k = _two_groups(rows, _calm()), _keys(16)
    sk, sv, sm = compress_blocks(k, v, _cfg())
    assert sm[0, :2].tolist() == [7.0, 1.0]
    assert torch.equal(sk[0, :, 0], k[0, :, 6])  # last *background* token
    assert torch.equal(sk[0, :, 1], k[0, :, 7])


def test_mean_key_ablation_and_mass_weighted_mean():
    rows = [[float(i + 1), 0.0, 0.0, 0.0] for i in range(G)]
    rows[2] = E2
    v, k = _two_groups(rows, _calm()), _keys(16)
    mass = torch.tensor([[1.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0] + [1.0] * 8])
    sk, sv, sm = compress_blocks(k, v, _cfg(background_key="mean"), mass=mass)
    bg = [0, 1, 3, 4, 5, 6, 7]
    w = mass[0, bg]
    assert sm[0, :2].tolist() == [w.sum().item(), 1.0]
    expect_v = (v[0, :, bg] * w[None, :, None]).sum(1) / w.sum()
    expect_k = (k[0, :, bg] * w[None, :, None]).sum(1) / w.sum()
    assert torch.allclose(sv[0, :, 0], expect_v) and torch.allclose(sk[0, :, 0], expect_k)


def test_outliers_off_never_emits():
    rows = [E1] * G
    rows[3] = E2
    v = _two_groups(rows, rows)
    _, sv, sm = compress_blocks(_keys(16), v, _cfg(outliers=False))
    assert sm.tolist() == [[8.0, 0.0, 8.0, 0.0]]
    assert torch.allclose(sv[0, :, 0], v[0, :, :8].mean(1))


def test_zero_values_do_not_produce_nan():
    v = torch.zeros(1, 2, 16, 4)
    sk, sv, sm = compress_blocks(_keys(16), v, _cfg())
    assert torch.isfinite(sv).all() and sm.view(-1, 2).sum(-1).tolist() == [8.0, 8.0]


def test_decisions_are_per_sequence():
    rows = [E1] * G
    rows[3] = E2
    odd = _two_groups(rows, _calm())
    calm = _two_groups(_calm(), _calm())
    k = _keys(16)
    batch = compress_blocks(torch.cat([k, k]), torch.cat([odd, calm]), _cfg())
    for i, single_v in enumerate((odd, calm)):
        single = compress_blocks(k, single_v, _cfg())
        for got, want in zip(batch, single):
            assert torch.equal(got[i:i + 1], want)


def test_gradients_flow_through_selected_keys_and_mean_values():
    torch.manual_seed(0)
    cfg = load_model_config("anchormass_tiny")
    k = torch.randn(2, 2, 128, 32, requires_grad=True)
    v = torch.randn(2, 2, 128, 32, requires_grad=True)
    sk, sv, sm = compress_blocks(k, v, cfg)
    (sk.sum() + sv.sum()).backward()
    assert torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()
    assert (v.grad != 0).all()  # every value feeds a background mean or an outlier slot
    assert (k.grad != 0).any() and (k.grad == 0).any()  # only anchors/outliers are picked


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), blocks=st.integers(1, 3), scale=st.floats(0.01, 100.0),
       spike=st.booleans())
def test_mass_per_group_is_exactly_G(seed, blocks, scale, spike):
    g = torch.Generator().manual_seed(seed)
    cfg = load_model_config("anchormass_tiny")
    n = blocks * cfg.block_size
    k = torch.randn(2, 2, n, 32, generator=g)
    v = torch.randn(2, 2, n, 32, generator=g) * scale
    if spike:
        v[:, :, ::5] *= 10.0
    sk, sv, sm = compress_blocks(k, v, cfg)
    assert sk.shape == sv.shape == (2, 2, n // cfg.group_size * 2, 32)
    per_group = sm.view(2, -1, 2)
    assert torch.equal(per_group.sum(-1), torch.full_like(per_group[..., 0], float(cfg.group_size)))
    assert set(per_group[..., 1].unique().tolist()) <= {0.0, 1.0}
    assert torch.isfinite(sv).all()


def test_the_retrofit_probe_reads_the_anchor_and_the_layout_from_the_model():
    """slot_probe.LayerView asks compression.anchor_index and kernels.layout.query_view: the positions it
    calls `anchor` hold exactly the background slots' keys, `outlier` the outlier slots' keys, and a query
    sees sinks, the slots of the blocks before its own, then its own block raw."""
    from anchormass.eval.suites.retrofit.slot_probe import LayerQKV, LayerView
    from anchormass.models.kernels.layout import query_view

    cfg = _cfg(n_sinks=3, outlier_cos=0.99)
    torch.manual_seed(0)
    t, nl = 3 + 2 * 16 + 5, cfg.n_local_heads  # sinks, two whole blocks, five tokens of a third
    q, k, v = (torch.randn(2, cfg.n_heads, t, 4) for _ in range(3))
    v[0, nl:, 3:3 + G] = torch.tensor([E1] * (G - 1) + [E2])  # row 0's first group: its outlier last
    view = LayerView(cfg, LayerQKV(q, k, v))
    query = t - 1
    statuses = [[view.status(b, p, query) for p in range(t)] for b in range(2)]
    assert {"anchor", "outlier", "averaged"} <= set(statuses[0] + statuses[1])
    assert statuses[0][3:3 + G] == ["averaged"] * (G - 2) + ["anchor", "outlier"]
    for b in range(2):
        assert statuses[b][:3] == ["raw"] * 3 and statuses[b][35:] == ["raw"] * 5
        for p, status in enumerate(statuses[b]):
            slot = 2 * ((p - 3) // G) + (status == "outlier")
            if status in ("anchor", "outlier"):
                assert torch.equal(view.slot_k[b, :, slot], k[b, nl:, p])
    assert query_view(query, 3, 16, 2) == query_view(query, 3, 16)
    seen = query_view(query, 3, 16)
    assert (seen.n_sink, seen.slot_blocks, seen.compressed_end, seen.tail_start) == (3, 2, 35, 35)
    assert query_view(1, 3, 16) == type(seen)(1, 2, 0, 3, 2)  # a sink sees the sinks up to itself
    assert query_view(20, 3, 16).tail_start == 19 and query_view(18, 3, 16).slot_blocks == 0
