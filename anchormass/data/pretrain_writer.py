"""Kind `pretrain`: documents (sources.py) -> cleaners -> [exact repeats dropped: dedup.py] ->
train/val split by document (seeded) -> tokenizer trained on the train documents (or reused: a
SentencePiece file or a Hugging Face folder) -> train.bin / val.bin, eos (or
data.tokenizer.document_end) after each document.

Cleaning + encoding run in `num_workers` processes (parallel_encode.py), streamed, in corpus
order; `num_shards=K shard_index=i` writes shard i of K (shards.py) for merge.py to join.
The files are byte-identical for every num_workers, and merged shards equal a one-machine run.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Iterator, Mapping

from tqdm import tqdm

from anchormass.data.dataset_dir import base_meta
from anchormass.data.dedup import deduplicated
from anchormass.data.parallel_encode import BLOCK_DOCS, BlockEncoder, limited, raw_blocks
from anchormass.data.shards import write_shard
from anchormass.data.sources import describe, iter_part, source_parts
from anchormass.data.split_writer import SplitWriter, split_stream
from anchormass.data.tokenizer_loader import dataset_tokenizer, document_end_id
from anchormass.errors import ConfigError


def _parallel_settings(cfg: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(num_workers, num_shards, shard_index, block_docs), checked."""
    def setting(key, default):
        return int(default if cfg.get(key) is None else cfg[key])

    workers, shards = setting("num_workers", 1), setting("num_shards", 1)
    index, block_docs = setting("shard_index", 0), setting("block_docs", BLOCK_DOCS)
    if workers < 1 or shards < 1 or block_docs < 1:
        raise ConfigError(f"data.num_workers, data.num_shards and data.block_docs must be >= 1, got "
                          f"{workers}, {shards}, {block_docs}")
    if not 0 <= index < shards:
        raise ConfigError(f"data.shard_index must be in [0, {shards}) for data.num_shards={shards}, got {index}")
    return workers, shards, index, block_docs


def write_pretrain(cfg: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """Write the pretraining folder's files into `out`; returns its meta.json."""
    src, cleaners = cfg["source"], cfg.get("cleaners")
    seed, val_fraction = int(cfg.get("split_seed", 42)), float(cfg.get("val_fraction", 0.05))
    workers, shards, index, block_docs = _parallel_settings(cfg)
    split_stream(seed, val_fraction)  # checks val_fraction now: a shard run draws no split itself

    dedup = int(cfg["dedup_min_chars"]) if cfg.get("dedup_min_chars") else None

    def read_parts():  # one pass over the corpus (a deduplicated pass keeps its own memory of paragraphs)
        parts = source_parts(src, cleaners)
        return deduplicated(parts, dedup) if dedup else parts

    def split_docs(want_val: bool) -> Iterator[str]:
        docs = itertools.chain.from_iterable(iter_part(p) for p in read_parts())
        is_val = split_stream(seed, val_fraction)
        return (d for d in docs if is_val() == want_val)

    max_docs = (cfg.get("tokenizer") or {}).get("max_docs")
    tok = dataset_tokenizer(cfg, out, lambda: tqdm(split_docs(False) if not max_docs else
                                            (d for _, d in zip(range(int(max_docs)), split_docs(False))),
                                            desc="tokenizer docs", unit="doc", leave=False))
    parts = read_parts()
    desc = describe(parts)
    end_id = document_end_id(cfg, tok)
    base = {**base_meta(cfg, "pretrain", tok, desc), "document_end_id": end_id}
    progress = tqdm(desc="encode", unit="doc")
    with BlockEncoder(tok, out / tok.file_name, workers, end_id) as encoder:
        if shards > 1:
            recipe = {"block_docs": block_docs, "split_seed": seed, "val_fraction": val_fraction}
            return write_shard(out, encoder, parts, index, shards, block_docs, progress,
                               {"dataset": base, "recipe": recipe})
        writer = SplitWriter(out, tok.vocab_size, tok.checksum, desc, seed, val_fraction)
        try:
            for part in parts:
                encoded = (enc for _, enc in encoder.encode(part, enumerate(raw_blocks(part, block_docs))))
                for enc in limited(encoded, part.limit):
                    writer.add(enc)
                    progress.update(len(enc))
            stats = writer.finish()
        except BaseException:
            writer.abort()
            raise
        finally:
            progress.close()
    return {**base, "splits": stats}
