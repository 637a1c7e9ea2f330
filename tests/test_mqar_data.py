"""MQAR item generator: layout, determinism, placement law, input checks."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anchormass.data.mqar import MQARVocab, make_item, training_example
from anchormass.errors import ConfigError

VOCAB = MQARVocab(keys=(10, 74), values=(100, 132), noise=(200, 400))


@st.composite
def shapes(draw):
    n_pairs = draw(st.integers(1, 16))
    n_queries = draw(st.integers(1, n_pairs))
    length = draw(st.integers(2 * n_pairs + 2 * n_queries, 2 * n_pairs + 2 * n_queries + 80))
    return length, n_pairs, n_queries, draw(st.integers(0, 2 ** 31)), draw(st.integers(0, 1000)), \
        draw(st.sampled_from([0.0, 0.5, 1.0, 2.0]))


@settings(max_examples=200, deadline=None)
@given(shapes())
def test_item_layout(shape):
    length, n_pairs, n_queries, seed, index, alpha = shape
    item = make_item(VOCAB, length, n_pairs, n_queries, seed, index, alpha)
    ids = np.asarray(item.ids)
    assert ids.size == length == item.length
    C = item.context_len
    assert C == length - 2 * n_queries
    assert item.query_pos == [C + 2 * q for q in range(n_queries)]
    is_key = (ids >= VOCAB.keys[0]) & (ids < VOCAB.keys[1])
    is_val = (ids >= VOCAB.values[0]) & (ids < VOCAB.values[1])
    is_noise = (ids >= VOCAB.noise[0]) & (ids < VOCAB.noise[1])
    assert (is_key | is_val | is_noise).all()  # every token in one of the ranges
    key_pos = np.flatnonzero(is_key)
    ctx_keys = key_pos[key_pos < C]
    # exactly n_pairs keys in the context, each followed by a value; distinct keys
    assert ctx_keys.size == n_pairs
    assert is_val[ctx_keys + 1].all()
    assert len(set(ids[ctx_keys].tolist())) == n_pairs
    # values only right after a key (in context or query region)
    assert set(np.flatnonzero(is_val).tolist()) == set((key_pos + 1).tolist())
    # query region: key, value, key, value ...; distinct keys of the item
    assert set(key_pos[key_pos >= C].tolist()) == set(item.query_pos)
    q_keys = ids[item.query_pos].tolist()
    assert len(set(q_keys)) == n_queries and set(q_keys) <= set(ids[ctx_keys].tolist())
    pair_of = {int(ids[p]): int(p) for p in ctx_keys}
    for q, p, v, d in zip(item.query_pos, item.pair_pos, item.values, item.distances):
        assert pair_of[int(ids[q])] == p
        assert ids[q + 1] == v == ids[p + 1]  # the query's value equals its pair's value
        assert d == q - (p + 1) - 1 >= 0  # tokens strictly between the pair's value and the query key


@settings(max_examples=50, deadline=None)
@given(shapes())
def test_training_example_mask(shape):
    length, n_pairs, n_queries, seed, index, alpha = shape
    ids, mask = training_example(VOCAB, length, n_pairs, n_queries, seed, index, alpha)
    item = make_item(VOCAB, length, n_pairs, n_queries, seed, index, alpha)
    assert ids.tolist() == item.ids and mask.shape == (length,) and mask[0] == 0
    assert np.flatnonzero(mask).tolist() == [p + 1 for p in item.query_pos]


def test_deterministic_and_order_independent():
    args = [(64, 4, 4, 0, i, 0.0) for i in range(5)] + [(96, 8, 3, 7, 2, 1.0)]
    first = [make_item(VOCAB, *a) for a in args]
    again = [make_item(VOCAB, *a) for a in reversed(args)][::-1]
    assert [x.ids for x in first] == [x.ids for x in again]
    # a different index / seed / alpha gives a different item
    assert first[0].ids != first[1].ids
    assert make_item(VOCAB, 64, 4, 4, 1, 0).ids != first[0].ids
    assert make_item(VOCAB, 64, 4, 4, 0, 0, alpha=0.5).ids != first[0].ids


def test_power_law_shortens_distances():
    flat = [d for i in range(200) for d in make_item(VOCAB, 512, 8, 8, 0, i, 0.0).distances]
    short = [d for i in range(200) for d in make_item(VOCAB, 512, 8, 8, 0, i, 1.0).distances]
    assert np.median(short) < 0.5 * np.median(flat)


def test_uniform_depth_when_alpha_zero():
    # alpha = 0: pair positions spread over the whole context (mean near the middle)
    pos = [p for i in range(300) for p in make_item(VOCAB, 256, 4, 4, 0, i).pair_pos]
    C = 256 - 8
    assert abs(np.mean(pos) / C - 0.5) < 0.05


@pytest.mark.parametrize("ranges, words", [
    (dict(keys=(0, 10), values=(5, 20), noise=(30, 40)), "overlap"),
    (dict(keys=(0, 10), values=(20, 30), noise=(25, 40)), "overlap"),
    (dict(keys=(10, 10), values=(20, 30), noise=(30, 40)), "empty"),
])
def test_vocab_validation(ranges, words):
    with pytest.raises(ConfigError, match=words) as err:
        MQARVocab(**ranges)
    assert "\n" not in str(err.value)


def test_from_config_and_fit():
    v = MQARVocab.from_config({"keys": [256, 512], "values": [512, 768], "noise": [768, 1024]})
    v.check_fits(1024)
    with pytest.raises(ConfigError, match="up to 1023 need a vocabulary of at least 1024; the model has 512"):
        v.check_fits(512)
    with pytest.raises(ConfigError, match="needs keys"):
        MQARVocab.from_config({"keys": [0, 1]})


@pytest.mark.parametrize("length, n_pairs, n_queries, words", [
    (10, 4, 2, "at least 12 tokens"),
    (100, 2, 3, "exceeds n_pairs"),
    (1000, 65, 1, "key range holds only 64"),
])
def test_unbuildable_shapes(length, n_pairs, n_queries, words):
    with pytest.raises(ConfigError, match=words):
        make_item(VOCAB, length, n_pairs, n_queries, 0, 0)
