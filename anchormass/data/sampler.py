"""The step-indexed global data order (docs/method.md §4: seed-synchronized loading).

Samples 0..n-1 (fixed-length windows of a token file, or SFT examples) form an endless stream:
epoch e is the permutation `default_rng([seed, e]).permutation(n)`, epochs back to back. The global
batch of optimizer step k is stream positions [k*G, (k+1)*G) (G = global batch size), so it is a
pure function of (n, G, seed, k) -- no state but k -- and every sample appears exactly once per
epoch (a batch may straddle two epochs; nothing is dropped).

Splitting a global batch (world size W, gradient accumulation A; micro-batch size G / (W*A)):
rank r owns the contiguous slice [r*G/W, (r+1)*G/W) of every global batch and feeds it as A
micro-batches in order, so micro-batch j of rank r is step j // A, part j % A of that slice.
The union over ranks and micro-batches of step k is always the same G samples, whatever W and A.
"""

from __future__ import annotations

import functools

import numpy as np

from anchormass.errors import ConfigError


class GlobalOrder:
    def __init__(self, n_samples: int, global_batch_size: int, seed: int):
        if n_samples <= 0:
            raise ConfigError("the dataset has no samples (corpus shorter than one sequence?)")
        if global_batch_size <= 0:
            raise ConfigError(f"global_batch_size must be positive, got {global_batch_size}")
        self.n = int(n_samples)
        self.global_batch_size = int(global_batch_size)
        self.seed = int(seed)

    @functools.lru_cache(maxsize=4)
    def _perm(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def positions(self, start: int, count: int) -> np.ndarray:
        """Sample ids at stream positions [start, start + count)."""
        pos = np.arange(start, start + count, dtype=np.int64)
        out = np.empty(count, dtype=np.int64)
        for epoch in np.unique(pos // self.n):
            sel = pos // self.n == epoch
            out[sel] = self._perm(int(epoch))[pos[sel] % self.n]
        return out

    def global_batch(self, step: int) -> np.ndarray:
        """The G sample ids of optimizer step `step`."""
        return self.positions(step * self.global_batch_size, self.global_batch_size)

    @property
    def steps_per_epoch(self) -> int:
        return -(-self.n // self.global_batch_size)


class RankSlicer:
    """Which samples micro-batch j of one rank holds (see the module docstring)."""

    def __init__(self, order: GlobalOrder, world_size: int = 1, rank: int = 0, accumulate: int = 1):
        g = order.global_batch_size
        if world_size < 1 or not 0 <= rank < world_size or accumulate < 1:
            raise ConfigError(f"bad rank layout: rank {rank} of {world_size}, accumulate {accumulate}")
        if g % (world_size * accumulate):
            raise ConfigError(f"global_batch_size {g} must be divisible by world_size x accumulate_grad_batches "
                              f"= {world_size} x {accumulate}")
        self.order, self.world_size, self.rank, self.accumulate = order, world_size, rank, accumulate
        self.micro_batch_size = g // (world_size * accumulate)

    def micro_batch(self, j: int) -> np.ndarray:
        step, part = divmod(j, self.accumulate)
        start = step * self.order.global_batch_size + self.rank * (self.order.global_batch_size // self.world_size)
        return self.order.positions(start + part * self.micro_batch_size, self.micro_batch_size)
