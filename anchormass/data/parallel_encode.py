"""Cleaning + tokenising a corpus with N worker processes, in the corpus's order (docs/method.md §4).

The main process reads raw texts (`sources.SourcePart`) and groups them into blocks: at most
`block_docs` texts, closed early once they hold `BLOCK_CHARS` characters. Workers turn a block into
documents (`sources.documents_of`: clean, chunk, drop empty) and token ids, the document-end id
(eos unless the data config names another) after each document. Blocks come back in the order
they were read, at most 2 per worker in flight, so the output is the same for every N and memory
stays bounded by a few blocks whatever the corpus size.

Block boundaries depend only on the corpus and `block_docs`, never on N: they are the unit that
sharded preparation assigns to machines (`block_owner`, shards.py), so every shard agrees on them.
Encoding a document does not depend on its neighbours, hence neither does the output on blocks.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from anchormass.data.cleaners import get_cleaners
from anchormass.data.sources import SourcePart, documents_of
from anchormass.data.tokenizer_base import TokenizerBase
from anchormass.data.tokenizer_loader import load_tokenizer
from anchormass.parent_death import end_with_parent

BLOCK_CHARS = 1 << 20  # ~1.5 s of SentencePiece work on Japanese text: coarse enough to hide the IPC
BLOCK_DOCS = 256       # default data.block_docs


@dataclass
class EncodedBlock:
    """A block's documents: tokens back to back (the end id after each), and per document its
    token count (with the end id) and character count."""

    tokens: np.ndarray   # uint16 [sum(lengths)]
    lengths: np.ndarray  # int64 [n_docs]
    chars: np.ndarray    # int64 [n_docs]

    def __len__(self) -> int:
        return len(self.lengths)

    def head(self, n_docs: int) -> "EncodedBlock":
        """The first n_docs documents (a source's `limit` can end inside a block)."""
        if n_docs >= len(self):
            return self
        return EncodedBlock(self.tokens[: int(self.lengths[:n_docs].sum())], self.lengths[:n_docs],
                            self.chars[:n_docs])


def raw_blocks(part: SourcePart, block_docs: int) -> Iterator[list[str]]:
    """The raw texts of `part` in blocks (see the module docstring)."""
    block: list[str] = []
    size = 0
    for text in part.texts():
        block.append(text)
        size += len(text)
        if len(block) >= block_docs or size >= BLOCK_CHARS:
            yield block
            block, size = [], 0
    if block:
        yield block


def block_owner(part_index: int, block: int, num_shards: int) -> int:
    """Which shard encodes block `block` of source `part_index`: round robin, starting one shard
    later for each source so that many small sources do not all land on shard 0."""
    return (part_index + block) % num_shards


_WORKER: dict = {}  # per process: the tokenizer ("tok") and the document-end id ("end"), set once by _init


def _init(tokenizer_path: str, checksum: str, end_id: int, parent_pid: int) -> None:
    # A worker ends with prepare_data.py, however that ends (SIGKILL included): otherwise it is
    # re-parented and lives on, and with it the resource tracker that waits for every worker.
    # SIGKILL: a worker holds nothing to save.
    end_with_parent(parent_pid, signal.SIGKILL)
    tok = load_tokenizer(tokenizer_path)  # the copy in the folder being prepared
    if tok.checksum != checksum:
        raise RuntimeError(f"{tokenizer_path} changed while the dataset was being prepared")
    _WORKER.update(tok=tok, end=end_id)


def encode_block(texts: list[str], cleaners: tuple[str, ...], chunk_chars: int | None) -> EncodedBlock:
    tok: TokenizerBase = _WORKER["tok"]
    end_id: int = _WORKER["end"]
    fns = get_cleaners(list(cleaners))
    docs = [d for text in texts for d in documents_of(text, fns, chunk_chars)]
    flat: list[int] = []
    lengths = np.empty(len(docs), dtype=np.int64)
    # one thread per worker: N workers use N cores, and 1 worker is one core (an honest baseline)
    for i, ids in enumerate(tok.encode_batch(docs, num_threads=1) if docs else []):
        flat += ids
        flat.append(end_id)
        lengths[i] = len(ids) + 1
    # uint16 holds every id: both kinds of tokenizer refuse a vocabulary past 65,536 ids
    return EncodedBlock(np.array(flat, dtype=np.uint16), lengths,
                        np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs)))


class BlockEncoder:
    """`encode(part, blocks)` -> EncodedBlocks in order, by `num_workers` processes (1: this one).

    Workers are spawned, not forked: the parent has `datasets` / Arrow threads by now, and a fork
    copies their locks in whatever state they are; each loads the tokenizer from `tokenizer_path`
    (its copy in the folder being prepared). Use as a context manager."""

    def __init__(self, tokenizer: TokenizerBase, tokenizer_path: str | os.PathLike, num_workers: int = 1,
                 end_id: int | None = None):
        end_id = tokenizer.eos_id if end_id is None else int(end_id)
        self.num_workers = int(num_workers)
        self._pool = None
        if self.num_workers > 1:
            # concurrent.futures, not multiprocessing.Pool: a worker that dies (OOM killer, a crash)
            # is a BrokenProcessPool error here instead of a hang
            self._pool = ProcessPoolExecutor(self.num_workers, mp_context=multiprocessing.get_context("spawn"),
                                             initializer=_init,
                                             initargs=(str(tokenizer_path), tokenizer.checksum, end_id, os.getpid()))
        else:
            _WORKER.update(tok=tokenizer, end=end_id)

    def encode(self, part: SourcePart, blocks: Iterable[tuple[int, list[str]]]) -> Iterator[tuple[int, EncodedBlock]]:
        """(block id, EncodedBlock) for each (block id, raw texts), in the order given. Stopping
        early (a `limit`) drops the blocks still in flight."""
        if self._pool is None:
            for b, texts in blocks:
                yield b, encode_block(texts, part.cleaners, part.chunk_chars)
            return
        pending: collections.deque = collections.deque()
        for b, texts in blocks:
            pending.append((b, self._pool.submit(encode_block, texts, part.cleaners, part.chunk_chars)))
            if len(pending) >= 2 * self.num_workers:  # bounded: the reader never runs far ahead
                b0, future = pending.popleft()
                yield b0, future.result()
        while pending:
            b0, future = pending.popleft()
            yield b0, future.result()

    def __enter__(self) -> "BlockEncoder":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        _WORKER.clear()


def limited(blocks: Iterable[EncodedBlock], limit: int | None) -> Iterator[EncodedBlock]:
    """`blocks` up to `limit` documents in all (None: all of them), the last one cut to fit."""
    taken = 0
    for block in blocks:
        if limit:
            block = block.head(limit - taken)
        taken += len(block)
        yield block
        if limit and taken >= limit:
            return
