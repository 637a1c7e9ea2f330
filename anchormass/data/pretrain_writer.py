"""Kind `pretrain`: documents (sources.py) -> cleaners -> train/val split by document (seeded) ->
tokenizer trained on the train documents (or reused) -> train.bin / val.bin, eos after each document.

Cleaning + encoding run in `num_workers` processes (parallel_encode.py), streamed, in corpus
order; `num_shards=K shard_index=i` writes shard i of K (shards.py) for merge.py to join.
The files are byte-identical for every num_workers, and merged shards equal a one-machine run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

from tqdm import tqdm

from anchormass.data.dataset_dir import base_meta
from anchormass.data.parallel_encode import BLOCK_DOCS, BlockEncoder, limited, raw_blocks
from anchormass.data.shards import write_shard
from anchormass.data.sources import describe, iter_documents, source_parts
from anchormass.data.split_writer import SplitWriter, split_stream
from anchormass.data.tokenizer import dataset_tokenizer
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

    def split_docs(want_val: bool) -> Iterator[str]:
        docs, _ = iter_documents(src, cleaners)
        is_val = split_stream(seed, val_fraction)
        return (d for d in docs if is_val() == want_val)

    max_docs = (cfg.get("tokenizer") or {}).get("max_docs")
    tok = dataset_tokenizer(cfg, out, lambda: tqdm(split_docs(False) if not max_docs else
                                            (d for _, d in zip(range(int(max_docs)), split_docs(False))),
                                            desc="tokenizer docs", unit="doc", leave=False))
    parts = source_parts(src, cleaners)
    desc = describe(parts)
    base = base_meta(cfg, "pretrain", tok, desc)
    progress = tqdm(desc="encode", unit="doc")
    with BlockEncoder(tok, (out / "tokenizer.model").read_bytes(), workers) as encoder:
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
