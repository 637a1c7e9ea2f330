"""Multi-query associative recall (MQAR) items in token space (docs/method.md §6 g).

An item of `length` tokens is a context followed by a query region:

    context (C = length - 2 * n_queries tokens): noise tokens with n_pairs adjacent
        (key, value) pairs at distinct, non-overlapping positions; keys distinct within the item
    query region: n_queries distinct keys of the item in random order, each followed by its value

The value after a query key is the target: a model that recalls the pair predicts it at the
key's position. Token ids come from three disjoint ranges (`MQARVocab`), so a key, a value and a
noise token can never be confused. Every item is a pure function of (seed, length, n_pairs,
n_queries, index, alpha): the same for every model and every call order.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from anchormass.errors import ConfigError

# Mixed into every item's seed so that MQAR streams never coincide with another generator's.
_STREAM_TAG = 0x6D716172  # "mqar"


@dataclass(frozen=True)
class MQARVocab:
    """Half-open token-id ranges [lo, hi) for keys, values and noise; non-empty and disjoint."""

    keys: tuple[int, int]
    values: tuple[int, int]
    noise: tuple[int, int]

    def __post_init__(self):
        ranges = {"keys": self.keys, "values": self.values, "noise": self.noise}
        for name, r in ranges.items():
            if len(r) != 2 or not all(isinstance(x, (int, np.integer)) for x in r):
                raise ConfigError(f"mqar: vocab.{name} must be [lo, hi] integers, got {list(r)}")
            lo, hi = int(r[0]), int(r[1])
            if lo < 0 or hi <= lo:
                raise ConfigError(f"mqar: vocab.{name} [{lo}, {hi}) is empty or negative")
            object.__setattr__(self, name, (lo, hi))
        names = list(ranges)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                (alo, ahi), (blo, bhi) = getattr(self, a), getattr(self, b)
                if alo < bhi and blo < ahi:
                    raise ConfigError(f"mqar: vocab.{a} [{alo}, {ahi}) and vocab.{b} [{blo}, {bhi}) overlap")

    @classmethod
    def from_config(cls, mapping) -> "MQARVocab":
        if not hasattr(mapping, "keys") or not all(k in mapping for k in ("keys", "values", "noise")):
            raise ConfigError("mqar: vocab needs keys, values and noise ranges ([lo, hi] each)")
        unknown = set(mapping) - {"keys", "values", "noise"}
        if unknown:
            raise ConfigError(f"mqar: unknown vocab field(s) {', '.join(sorted(unknown))}")
        return cls(*(tuple(mapping[k]) for k in ("keys", "values", "noise")))

    @property
    def max_id(self) -> int:
        return max(self.keys[1], self.values[1], self.noise[1]) - 1

    @property
    def n_keys(self) -> int:
        return self.keys[1] - self.keys[0]

    def check_fits(self, vocab_size: int) -> None:
        if self.max_id >= vocab_size:
            raise ConfigError(f"mqar: token ids up to {self.max_id} need a vocabulary of at least "
                              f"{self.max_id + 1}; the model has {vocab_size}")


@dataclass
class MQARItem:
    ids: list[int]  # exactly `length` tokens
    context_len: int
    query_pos: list[int]  # position of each query key in ids; its target is ids[p + 1]
    values: list[int]  # the target of each query
    distances: list[int]  # tokens strictly between the pair's value in the context and the query key
    length: int
    n_pairs: int
    index: int
    seed: int
    pair_pos: list[int] = field(default_factory=list)  # key position in the context, per query


def check_shape(vocab: MQARVocab, length: int, n_pairs: int, n_queries: int, alpha: float = 0.0) -> None:
    """One ConfigError line when an item of this shape cannot be built."""
    if n_pairs < 1 or n_queries < 1:
        raise ConfigError(f"mqar: n_pairs ({n_pairs}) and n_queries ({n_queries}) must be at least 1")
    if n_queries > n_pairs:
        raise ConfigError(f"mqar: n_queries ({n_queries}) exceeds n_pairs ({n_pairs})")
    if 2 * n_pairs + 2 * n_queries > length:
        raise ConfigError(f"mqar: {n_pairs} pairs and {n_queries} queries need at least "
                          f"{2 * n_pairs + 2 * n_queries} tokens; length is {length}")
    if vocab.n_keys < n_pairs:
        raise ConfigError(f"mqar: {n_pairs} distinct keys per item but the key range holds only {vocab.n_keys}")
    if not (alpha >= 0 and np.isfinite(alpha)):
        raise ConfigError(f"mqar: alpha must be a finite number >= 0, got {alpha}")


def _rng(seed: int, length: int, n_pairs: int, n_queries: int, index: int, alpha: float):
    # alpha enters through its exact bit pattern, so 0.5 and 0.50000001 give different streams
    # and no rounding rule is needed.
    alpha_bits = int.from_bytes(struct.pack("<d", float(alpha)), "little")
    return np.random.default_rng([_STREAM_TAG, int(seed), int(length), int(n_pairs), int(n_queries),
                                  int(index), alpha_bits])


def _pair_positions(rng, context_len: int, n_pairs: int, alpha: float) -> np.ndarray:
    """Sorted key positions of n_pairs non-overlapping 2-token pairs in a context of context_len.

    Remove one token from each pair and the pairs become single slots in a shorter line of
    context_len - n_pairs cells; any choice of n distinct cells there maps back (the i-th chosen
    cell, in order, shifts right by i) to a valid non-overlapping placement and vice versa. Cells
    are drawn without replacement with weight d^-alpha, d being the cell's distance from the end
    of the line (>= 1): alpha = 0 is a uniform placement; alpha > 0 favours pairs near the end,
    i.e. short key-to-query distances."""
    cells = context_len - n_pairs
    if alpha == 0:
        chosen = rng.choice(cells, size=n_pairs, replace=False)
    else:
        d = cells - np.arange(cells, dtype=np.float64)  # cell c is d = cells - c from the end
        w = d ** (-alpha)
        chosen = rng.choice(cells, size=n_pairs, replace=False, p=w / w.sum())
    return np.sort(chosen) + np.arange(n_pairs)


def make_item(vocab: MQARVocab, length: int, n_pairs: int, n_queries: int, seed: int, index: int,
              alpha: float = 0.0) -> MQARItem:
    """Item `index` of the stream (seed, length, n_pairs, n_queries, alpha); see the module doc."""
    length, n_pairs, n_queries, index = int(length), int(n_pairs), int(n_queries), int(index)
    check_shape(vocab, length, n_pairs, n_queries, alpha)
    rng = _rng(seed, length, n_pairs, n_queries, index, alpha)
    context_len = length - 2 * n_queries
    ids = rng.integers(vocab.noise[0], vocab.noise[1], size=length, dtype=np.int64)
    keys = vocab.keys[0] + rng.choice(vocab.n_keys, size=n_pairs, replace=False)
    values = rng.integers(vocab.values[0], vocab.values[1], size=n_pairs, dtype=np.int64)
    pos = _pair_positions(rng, context_len, n_pairs, alpha)
    # Pair j is placed at the j-th chosen position in a random order, so which key sits where
    # carries no information.
    where = rng.permutation(n_pairs)
    pair_pos = np.empty(n_pairs, dtype=np.int64)
    pair_pos[where] = pos
    ids[pair_pos] = keys
    ids[pair_pos + 1] = values
    asked = rng.permutation(n_pairs)[:n_queries]
    query_pos = context_len + 2 * np.arange(n_queries)
    ids[query_pos] = keys[asked]
    ids[query_pos + 1] = values[asked]
    return MQARItem(ids=ids.tolist(), context_len=context_len, query_pos=query_pos.tolist(),
                    values=values[asked].tolist(),
                    distances=(query_pos - pair_pos[asked] - 2).tolist(),
                    length=length, n_pairs=n_pairs, index=index, seed=int(seed),
                    pair_pos=pair_pos[asked].tolist())


def training_example(vocab: MQARVocab, length: int, n_pairs: int, n_queries: int, seed: int, index: int,
                     alpha: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(ids int64 [length], mask uint8 [length]) of `make_item`; mask[t] = 1 where token t is a
    loss target, i.e. exactly at the values of the query region (the MQAR loss)."""
    item = make_item(vocab, length, n_pairs, n_queries, seed, index, alpha)
    mask = np.zeros(length, dtype=np.uint8)
    mask[np.asarray(item.query_pos) + 1] = 1
    return np.asarray(item.ids, dtype=np.int64), mask
