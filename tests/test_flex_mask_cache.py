"""FlexAttention block masks are built once per (length, layout, device) and shared by every layer,
step and model instance. The compiled kernel itself is replaced by a fake, so this runs in seconds."""

import pytest
import torch

from anchormass.models import build_model, load_model_config
from anchormass.models.kernels import flex


@pytest.fixture
def counted(monkeypatch):
    """Count mask builds; record the mask each attention call receives."""
    builds, used = [], []

    def fake_create_block_mask(mask_mod, b, h, q_len, kv_len, device, _compile):
        builds.append((q_len, kv_len, device))
        return object()  # a distinct token per build

    def fake_flex(q, k, v, score_mod=None, block_mask=None, enable_gqa=False):
        used.append(block_mask)
        return torch.zeros_like(q)

    monkeypatch.setattr(flex, "create_block_mask", fake_create_block_mask)
    monkeypatch.setattr(flex, "compiled_flex", fake_flex)
    monkeypatch.setattr(flex, "_BLOCK_MASKS", type(flex._BLOCK_MASKS)())
    return builds, used


def _model(**changes):
    cfg = load_model_config("anchormass_tiny").replace(**{"attn_impl": "flex", "n_layers": 3, "vocab_size": 64,
                                                          **changes})
    return build_model(cfg).eval()


@torch.no_grad()
def test_one_build_per_length_and_layout(counted):
    builds, used = counted
    m = _model()
    ids = torch.randint(0, 64, (2, 100))
    for _ in range(3):  # three steps x three layers x (local + global)
        m(ids)
    assert len(builds) == 2
    assert len(used) == 3 * 3 * 2 and len({id(x) for x in used}) == 2
    _model()(ids)  # another model with the same layout reuses them
    assert len(builds) == 2
    m(ids[:, :77])  # a new length: one local + one global mask
    assert len(builds) == 4
    _model(window=32)(ids)  # a new window changes only the local mask
    assert len(builds) == 5
    m(ids)  # the first length is still cached
    assert len(builds) == 5


@torch.no_grad()
def test_cache_is_bounded(counted, monkeypatch):
    builds, _ = counted
    monkeypatch.setattr(flex, "MAX_CACHED_MASKS", 4)
    m = _model(n_layers=1)
    for t in range(20, 30):
        m(torch.zeros(1, t, dtype=torch.long))
    assert len(builds) == 20 and len(flex._BLOCK_MASKS) == 4
    m(torch.zeros(1, 29, dtype=torch.long))  # among the newest: still cached
    assert len(builds) == 20
