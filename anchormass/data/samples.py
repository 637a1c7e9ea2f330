"""Sample sets: what sample i of a prepared split is, as (input_ids [T], targets [T]) int64 arrays.

Memmaps are opened lazily in each process: a pickled np.memmap would copy the whole file into
every DataLoader worker. Files are validated once (in the DataModule) before these are built.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from anchormass.data.token_file import TOKEN_DTYPE

IGNORE = -100  # targets where no loss is taken (cross_entropy's ignore_index)


class TokenWindows:
    """Non-overlapping windows of T+1 tokens (stride T) over a flat token file: pretraining.

    Window i covers tokens [i*T, i*T + T]; input = its first T, targets = its last T (next tokens).
    Documents are not aligned to windows: eos separators inside a window are ordinary tokens."""

    def __init__(self, path: str | Path, n_tokens: int, seq_len: int):
        self.path, self.seq_len = str(path), int(seq_len)
        self.n = max(0, (int(n_tokens) - 1) // self.seq_len)
        self._tokens: np.ndarray | None = None

    def __len__(self) -> int:
        return self.n

    def get(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if self._tokens is None:
            self._tokens = np.memmap(self.path, dtype=TOKEN_DTYPE, mode="r")
        w = np.asarray(self._tokens[i * self.seq_len: (i + 1) * self.seq_len + 1], dtype=np.int64)  # [T+1]
        return w[:-1], w[1:]

    def __getstate__(self):
        return {**self.__dict__, "_tokens": None}


class MaskedExamples:
    """Variable-length examples with a loss mask (SFT, long-context SFT): one example per row.

    Example i is tokens[offsets[i]:offsets[i+1]]; mask[t] = 1 where token t is a loss target.
    Rows are cut to T+1 tokens and padded: input pad -> pad_id, target pad -> IGNORE."""

    def __init__(self, tokens_path: str | Path, mask_path: str | Path, offsets: np.ndarray, seq_len: int,
                 pad_id: int):
        self.tokens_path, self.mask_path = str(tokens_path), str(mask_path)
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.seq_len, self.pad_id = int(seq_len), int(pad_id)
        self._tokens: np.ndarray | None = None
        self._mask: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def get(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        if self._tokens is None:
            self._tokens = np.memmap(self.tokens_path, dtype=TOKEN_DTYPE, mode="r")
            self._mask = np.memmap(self.mask_path, dtype=np.uint8, mode="r")
        lo = int(self.offsets[i])
        hi = min(int(self.offsets[i + 1]), lo + self.seq_len + 1)
        ex = np.asarray(self._tokens[lo:hi], dtype=np.int64)
        keep = np.asarray(self._mask[lo:hi], dtype=bool)
        inp = np.full(self.seq_len, self.pad_id, dtype=np.int64)
        tgt = np.full(self.seq_len, IGNORE, dtype=np.int64)
        inp[: len(ex) - 1] = ex[:-1]
        tgt[: len(ex) - 1] = np.where(keep[1:], ex[1:], IGNORE)
        return inp, tgt

    def __getstate__(self):
        return {**self.__dict__, "_tokens": None, "_mask": None}
