"""Turning the global order into DataLoaders whose start is read when iteration begins.

The train loader is an IterableDataset of whole micro-batches, so Lightning never injects a
DistributedSampler (rank slicing is ours, see sampler.py) and workers can split the stream
without changing it: worker w of N yields micro-batches j = start + w, start + w + N, ... and
the DataLoader returns worker outputs round-robin, i.e. exactly in order j = start, start+1, ...
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from anchormass.data.sampler import RankSlicer


def collate(samples: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.from_numpy(np.stack([s[0] for s in samples])),   # [b, T]
            "targets": torch.from_numpy(np.stack([s[1] for s in samples]))}     # [b, T]


class MicroBatches(IterableDataset):
    """Micro-batches [start, start + count) of one rank; `start` is set by StepLoader per iteration."""

    def __init__(self, samples, slicer: RankSlicer, count: int):
        self.samples, self.slicer, self.count = samples, slicer, int(count)
        self.start = 0

    def batch(self, j: int) -> dict[str, torch.Tensor]:
        return collate([self.samples.get(int(i)) for i in self.slicer.micro_batch(j)])

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        for j in range(self.start + wid, self.start + self.count, nw):
            yield self.batch(j)

    def __len__(self) -> int:
        return self.count


class StepLoader(DataLoader):
    """A DataLoader over MicroBatches that asks `start_fn()` where to start each time it is iterated
    (workers are started afterwards, so they see the new start), and reports each yielded batch."""

    def __init__(self, dataset: MicroBatches, start_fn: Callable[[], int], on_batch: Callable[[], None],
                 num_workers: int = 0):
        super().__init__(dataset, batch_size=None, num_workers=num_workers, persistent_workers=False,
                         pin_memory=False)
        self._start_fn, self._on_batch = start_fn, on_batch

    def __iter__(self):
        self.dataset.start = int(self._start_fn())
        it = super().__iter__()  # now, not at the first next(): workers copy the dataset with this start
        return self._counted(it)

    # Lightning treats a loader with state_dict/load_state_dict as resumable (and stops warning that
    # a mid-epoch resume is unreliable). The position itself is the optimizer step, restored by the
    # trainer and the DataModule's own state, so there is nothing to store here.
    def state_dict(self) -> dict:
        return {"position": "trainer.global_step"}

    def load_state_dict(self, state: dict) -> None:
        pass

    def _counted(self, it):
        for batch in it:
            self._on_batch()
            yield batch
