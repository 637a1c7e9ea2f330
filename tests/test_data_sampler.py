"""The global order: a pure function of (n, G, seed, k); rank/accumulation slicing never changes it."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anchormass.data.sampler import GlobalOrder, RankSlicer
from anchormass.errors import ConfigError


def global_batch_from_ranks(order: GlobalOrder, step: int, world: int, acc: int) -> np.ndarray:
    """Reassemble step `step` from every rank's micro-batches, rank-major like the slices."""
    parts = []
    for rank in range(world):
        slicer = RankSlicer(order, world, rank, acc)
        parts += [slicer.micro_batch(step * acc + m) for m in range(acc)]
    return np.concatenate(parts)


def test_same_seed_same_order_different_seed_different():
    a, b, c = GlobalOrder(100, 8, 42), GlobalOrder(100, 8, 42), GlobalOrder(100, 8, 43)
    assert all(np.array_equal(a.global_batch(k), b.global_batch(k)) for k in range(30))
    assert not all(np.array_equal(a.global_batch(k), c.global_batch(k)) for k in range(30))


@pytest.mark.parametrize("world,acc", [(1, 1), (2, 1), (4, 1), (1, 4), (2, 2), (8, 1)])
def test_world_size_and_accumulation_do_not_change_global_batches(world, acc):
    order = GlobalOrder(37, 8, 7)
    for step in range(12):
        assert np.array_equal(global_batch_from_ranks(order, step, world, acc), order.global_batch(step))


def test_ranks_are_disjoint_within_a_step():
    order = GlobalOrder(1000, 16, 0)
    r0, r1 = RankSlicer(order, 2, 0), RankSlicer(order, 2, 1)
    assert not set(r0.micro_batch(3)) & set(r1.micro_batch(3))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), g=st.integers(1, 40), seed=st.integers(0, 2**32 - 1), epochs=st.integers(1, 3))
def test_each_sample_once_per_epoch(n, g, seed, epochs):
    order = GlobalOrder(n, g, seed)
    stream = np.concatenate([order.global_batch(k) for k in range(-(-epochs * n // g))])[: epochs * n]
    for e in range(epochs):
        assert sorted(stream[e * n:(e + 1) * n].tolist()) == list(range(n))


def test_bad_layouts_are_config_errors():
    order = GlobalOrder(10, 6, 0)
    with pytest.raises(ConfigError, match="divisible"):
        RankSlicer(order, world_size=4)
    with pytest.raises(ConfigError):
        GlobalOrder(0, 4, 0)
