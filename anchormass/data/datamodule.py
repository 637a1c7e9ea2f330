"""LightningDataModules with the seed-synchronized, resumable order of sampler.py.

Batches: {"input_ids": LongTensor[b, T], "targets": LongTensor[b, T]}, targets = next tokens,
-100 where no loss is taken; b = global_batch_size / (world_size * accumulate_grad_batches).

Where the train loader starts (resume). Lightning (2.6, `trainer.fit(ckpt_path=...)`) restores in
this order: `datamodule.load_state_dict` (in `_restore_modules_and_callbacks`), then the loops
(`restore_training_state`, which sets `trainer.global_step`), then `fit_loop.setup_data()` calls
`train_dataloader()` and `iter()` on it. So the loader reads its start when it is iterated:
`trainer.global_step` when attached to a trainer (correct on every later epoch too, and across
Lightning's own mid-epoch restart bookkeeping), otherwise the step restored by `load_state_dict`
plus the steps consumed since. `state_dict()` saves that next step with a data fingerprint; a
checkpoint from different data (or a different seq_len / global batch / seed) is refused unless
`allow_data_change=True`.

One Lightning "epoch" = one pass over the train samples (steps_per_epoch optimizer steps); use
`max_steps` for step-based training, epochs carry on seamlessly in the same global order.
Checkpoints should be taken at optimizer-step boundaries (Lightning's step-based ModelCheckpoint
does); a partly accumulated step is redone from its first micro-batch after a resume.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from anchormass.data.dataset_dir import PreparedDataset
from anchormass.data.loader import MicroBatches, StepLoader, collate
from anchormass.data.sampler import GlobalOrder, RankSlicer
from anchormass.data.samples import MaskedExamples, TokenWindows
from anchormass.errors import ConfigError, DataError

log = logging.getLogger(__name__)

# Lightning warns about any IterableDataset with __len__ that workers might duplicate data; ours
# assigns micro-batches to workers explicitly (loader.py), so the length is exact.
warnings.filterwarnings("ignore", message=r"Your `IterableDataset` has `__len__` defined")


class _ValSet(Dataset):
    def __init__(self, samples, indices: list[int]):
        self.samples, self.indices = samples, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        return self.samples.get(self.indices[i])


class StepDataModule(L.LightningDataModule):
    """Shared machinery; subclasses say how a split becomes a sample set (`_samples`)."""

    expected_kind = "pretrain"

    def __init__(self, data_dir: str, seq_len: int, global_batch_size: int, seed: int = 42, num_workers: int = 0,
                 *, world_size: int | None = None, rank: int | None = None, accumulate_grad_batches: int | None = None,
                 val_batch_size: int | None = None, val_samples: int | None = None,
                 allow_data_change: bool = False):
        super().__init__()
        if seq_len < 1:
            raise ConfigError(f"seq_len must be positive, got {seq_len}")
        self.data_dir, self.seq_len, self.global_batch_size = data_dir, int(seq_len), int(global_batch_size)
        self.seed, self.num_workers = int(seed), int(num_workers)
        self._world_size, self._rank, self._accumulate = world_size, rank, accumulate_grad_batches
        self.val_batch_size, self.val_samples = val_batch_size, val_samples
        self.allow_data_change = allow_data_change
        self.data = PreparedDataset(data_dir)
        if self.data.kind != self.expected_kind:
            raise DataError(f"{data_dir} holds '{self.data.kind}' data; {type(self).__name__} needs "
                            f"'{self.expected_kind}'")
        self.tokenizer = self.data.tokenizer
        self.vocab_size = self.data.vocab_size
        self.train_samples = self._samples("train")
        self.order = GlobalOrder(len(self.train_samples), self.global_batch_size, self.seed)
        self._fingerprint = self.data.fingerprint("train")
        self._step = 0  # next optimizer step when not attached to a trainer
        self._micro_seen = 0  # micro-batches yielded since _step was set (not attached)

    # ------------------------------------------------------------------ subclass hook
    def _samples(self, split: str):
        raise NotImplementedError

    # ------------------------------------------------------------------ layout
    def _layout(self) -> tuple[int, int, int]:
        """(world_size, rank, accumulate): explicit args, else the trainer, else torch.distributed."""
        trainer = self._trainer_or_none()
        world = self._world_size or (trainer.world_size if trainer else None)
        rank = self._rank if self._rank is not None else (trainer.global_rank if trainer else None)
        acc = self._accumulate or (trainer.accumulate_grad_batches if trainer else 1)
        if world is None or rank is None:
            dist = torch.distributed.is_available() and torch.distributed.is_initialized()
            world = world or (torch.distributed.get_world_size() if dist else 1)
            rank = rank if rank is not None else (torch.distributed.get_rank() if dist else 0)
        return int(world), int(rank), int(acc)

    def _trainer_or_none(self):
        return getattr(self, "trainer", None)

    @property
    def next_step(self) -> int:
        """The optimizer step whose global batch the train loader yields next."""
        trainer = self._trainer_or_none()
        if trainer is not None:
            return int(trainer.global_step)
        return self._step + self._micro_seen // self._layout()[2]

    # ------------------------------------------------------------------ loaders
    def train_dataloader(self) -> StepLoader:
        world, rank, acc = self._layout()
        slicer = RankSlicer(self.order, world, rank, acc)
        dataset = MicroBatches(self.train_samples, slicer, count=self.order.steps_per_epoch * acc)

        def start() -> int:
            step = self.next_step
            self._step, self._micro_seen = step, 0
            return step * acc

        def seen() -> None:
            self._micro_seen += 1

        return StepLoader(dataset, start, seen, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        samples = self._samples("val")
        n = len(samples)
        if n == 0:
            raise DataError(f"{self.data_dir}: val split is shorter than one sequence of {self.seq_len}")
        k = min(n, self.val_samples or n)
        indices = [i * n // k for i in range(k)]  # evenly spread, fixed
        world, rank, acc = self._layout()
        bs = self.val_batch_size or max(1, self.global_batch_size // (world * acc))
        # Each rank evaluates its own share (the trainer runs with use_distributed_sampler=False, as
        # the train order is sliced here too); Lightning averages the logged metric across ranks.
        return DataLoader(_ValSet(samples, indices[rank::world]), batch_size=bs, shuffle=False,
                          num_workers=self.num_workers, collate_fn=collate)

    # ------------------------------------------------------------------ resume
    def _order_params(self) -> dict[str, Any]:
        return {"seq_len": self.seq_len, "global_batch_size": self.global_batch_size, "seed": self.seed}

    def state_dict(self) -> dict[str, Any]:
        return {"next_step": self.next_step, "fingerprint": self._fingerprint, "order": self._order_params()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        problems = []
        if state.get("fingerprint") != self._fingerprint:
            problems.append(f"the data differ (fingerprint {str(state.get('fingerprint'))[:12]} in the checkpoint, "
                            f"{self._fingerprint[:12]} in {self.data_dir})")
        if state.get("order") != self._order_params():
            problems.append(f"the order settings differ ({state.get('order')} vs {self._order_params()})")
        if problems:
            msg = "resuming on different data: " + "; ".join(problems)
            if not self.allow_data_change:
                raise DataError(msg + "; set allow_data_change=true to resume anyway")
            log.warning("%s (allowed by allow_data_change)", msg)
        self._step, self._micro_seen = int(state["next_step"]), 0


class PretrainDataModule(StepDataModule):
    """Fixed windows of seq_len + 1 tokens of train.bin (stride seq_len), in the global order."""

    expected_kind = "pretrain"

    def _samples(self, split: str) -> TokenWindows:
        n_tokens = len(self.data.tokens(split))
        samples = TokenWindows(self.data.root / f"{split}.bin", n_tokens, self.seq_len)
        if split == "train" and len(samples) == 0:
            raise DataError(f"{self.data_dir}: train.bin has {n_tokens} tokens, fewer than one sequence "
                            f"of {self.seq_len} + 1")
        return samples


class SFTDataModule(StepDataModule):
    """One example per row (chat SFT or long-context SFT), cut to seq_len, loss where the mask says."""

    expected_kind = "sft"

    def _samples(self, split: str) -> MaskedExamples:
        _, offsets = self.data.sft_arrays(split)  # validates the token file too
        too_long = int((np.diff(offsets) > self.seq_len + 1).sum())
        if too_long:  # their tails are cut; a response cut away entirely leaves a row without loss
            log.warning("%s/%s: %d of %d examples are longer than seq_len + 1 = %d tokens and are cut",
                        self.data_dir, split, too_long, len(offsets) - 1, self.seq_len + 1)
        return MaskedExamples(self.data.root / f"{split}.bin", self.data.root / f"{split}.mask.bin", offsets,
                              self.seq_len, self.tokenizer.pad_id)


# The one place a dataset's kind chooses the DataModule that reads it (meta.json's `kind`): a stage
# config states the loader's settings, the data decides how rows become samples.
DATAMODULE_OF_KIND = {"pretrain": PretrainDataModule, "sft": SFTDataModule}


def datamodule_config(node, kind: str):
    """A stage's `datamodule` config with the `_target_` its data's kind needs; a `_target_` the
    config sets itself (a DataModule of one's own) is kept."""
    from omegaconf import OmegaConf

    if kind not in DATAMODULE_OF_KIND:
        raise DataError(f"no DataModule reads '{kind}' data (known kinds: {', '.join(DATAMODULE_OF_KIND)})")
    node = OmegaConf.create(OmegaConf.to_container(node, resolve=True))  # resolved, not struct: extendable
    if node.get("_target_") is None:
        cls = DATAMODULE_OF_KIND[kind]
        node._target_ = f"{cls.__module__}.{cls.__qualname__}"
    return node
