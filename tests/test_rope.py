import math

import pytest
import torch

from anchormass.models.rope import apply_rope, ntk_base, rope_cos_sin


def test_ntk_base_unchanged_up_to_trained_length_and_scaled_above():
    assert ntk_base(10_000.0, 1, 1024, 64) == 10_000.0
    assert ntk_base(10_000.0, 1024, 1024, 64) == 10_000.0
    scaled = ntk_base(10_000.0, 4096, 1024, 64)
    assert scaled == pytest.approx(10_000.0 * 4 ** (64 / 62))
    assert ntk_base(10_000.0, 8192, 1024, 64) > scaled > 10_000.0


def test_rope_is_a_rotation_that_depends_only_on_relative_position():
    torch.manual_seed(0)
    d = 32
    q, k = torch.randn(1, 1, 1, d), torch.randn(1, 1, 1, d)
    base = ntk_base(10_000.0, 5000, 1024, d)

    def score(pq, pk):
        cq, sq = rope_cos_sin(torch.tensor([pq]), base, d)
        ck, sk = rope_cos_sin(torch.tensor([pk]), base, d)
        return (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum().item()

    assert score(10, 3) == pytest.approx(score(1010, 1003), abs=1e-4)
    assert score(200_007, 200_000) == pytest.approx(score(7, 0), abs=1e-4)
    cos, sin = rope_cos_sin(torch.arange(7), base, d)
    rotated = apply_rope(q.expand(1, 1, 7, d), cos, sin)
    assert torch.allclose(rotated.norm(dim=-1), q.norm(dim=-1).expand(1, 1, 7), atol=1e-5)
    assert torch.equal(rotated[..., 0, :], q[..., 0, :])  # position 0: identity


def test_rotate_half_frequencies():
    d, base = 8, 100.0
    cos, sin = rope_cos_sin(torch.tensor([3]), base, d)
    for i in range(d // 2):
        ang = 3 * base ** (-2 * i / d)
        assert cos[0, i].item() == pytest.approx(math.cos(ang), abs=1e-6)
        assert sin[0, i + d // 2].item() == pytest.approx(math.sin(ang), abs=1e-6)
