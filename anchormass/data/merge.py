"""Merge the K shard folders of one corpus (shards.py) into the prepared folder a one-machine run writes.

Blocks are taken in corpus order, block b of source s from shard `block_owner(s, b, K)`; each
source stops at its `limit` documents or its last block; every document then draws its split from
the same seeded stream as in prepare.py, so train.bin / val.bin / sidecars / meta.json are
byte-identical to `prepare_data.py` without shards. Streaming: one block in memory at a time.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any, Iterator

from anchormass.data.parallel_encode import EncodedBlock, block_owner, limited
from anchormass.data.shards import ShardReader
from anchormass.data.split_writer import SplitWriter
from anchormass.data.staged_folder import build_folder
from anchormass.errors import ConfigError, DataError
from anchormass.path_checks import check_data_out_dir, check_folder_name
from anchormass.utils import resolve_path

# What every shard of one corpus must share (meta.json keys).
_SHARED = ("dataset", "recipe")


def open_shards(paths: list[str]) -> list[ShardReader]:
    """The shard folders (globs allowed), checked to be shards 0..K-1 of one recipe, by index."""
    folders: list[str] = []
    for pattern in paths:
        full = str(resolve_path(pattern))
        hits = sorted(glob.glob(full)) if glob.has_magic(full) else [full]
        if not hits or not all(os.path.isdir(h) for h in hits):
            raise DataError(f"shard folder not found: {pattern}")
        folders.extend(hits)
    if not folders:
        raise ConfigError("shards: give the shard folders, e.g. shards=[data/x.shard-0-of-2,data/x.shard-1-of-2]")
    readers = sorted((ShardReader(f) for f in dict.fromkeys(folders)), key=lambda r: r.index)
    count = readers[0].count
    if [r.index for r in readers] != list(range(count)) or any(r.count != count for r in readers):
        have = ", ".join(f"{r.index} of {r.count} ({r.root})" for r in readers)
        raise DataError(f"shards must be exactly shards 0..{count - 1} of {count}, got: {have}")
    for r in readers[1:]:
        for key in _SHARED:
            if r.meta[key] != readers[0].meta[key]:
                raise DataError(f"{r.root} and {readers[0].root} were prepared with a different {key} "
                                f"(tokenizer, source, split or block settings); prepare all shards with one recipe")
    return readers


def _part_blocks(readers: list[ShardReader], part: int) -> Iterator[EncodedBlock]:
    """Source `part`'s blocks in order, each from the shard that owns it."""
    totals = {r.meta["parts"][part]["total_blocks"] for r in readers} - {None}
    if len(totals) > 1:
        raise DataError(f"shards disagree on the number of blocks of source {part} ({sorted(totals)})")
    total = totals.pop() if totals else None
    block = 0
    while total is None or block < total:
        owner = readers[block_owner(part, block, len(readers))]
        if not owner.has(part, block):
            if total is None:  # every shard stopped at the limit: reached before this block (shards.py)
                return
            raise DataError(f"{owner.root} lacks block {block} of source {part} (an incomplete shard)")
        yield owner.read(part, block)
        block += 1


def _merge_into(readers: list[ShardReader], out: Path) -> dict[str, Any]:
    first = readers[0]
    data, recipe = first.meta["dataset"], first.meta["recipe"]
    first.tokenizer.save(out)
    writer = SplitWriter(out, data["vocab_size"], data["tokenizer_checksum"], data["source"],
                         int(recipe["split_seed"]), float(recipe["val_fraction"]))
    try:
        for part, limit in enumerate(recipe["limits"]):
            for block in limited(_part_blocks(readers, part), limit):
                writer.add(block)
        stats = writer.finish()
    except BaseException:
        writer.abort()
        raise
    return {**data, "splits": stats}


def merge_shards(shards: list[str], out_dir: str | None = None) -> tuple[Path, dict[str, Any]]:
    """Merge into out_dir (default data/<name>); returns (folder, meta) as prepare() does."""
    readers = open_shards(shards)
    # the default is named by the shards' meta.json: a plain folder name, or data/../.. would leave data/
    name = check_folder_name(readers[0].meta["dataset"]["name"], f"{readers[0].root}/meta.json: dataset name")
    out = check_data_out_dir(out_dir or f"data/{name}", "out_dir")
    if out in {r.root.resolve() for r in readers}:
        raise ConfigError(f"out_dir {out} is one of the shard folders; merge into another folder")
    return build_folder(out, lambda staging: _merge_into(readers, staging))
