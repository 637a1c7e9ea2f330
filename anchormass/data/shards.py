"""One shard of a pretrain corpus prepared on K machines (`data.num_shards=K data.shard_index=i`).

Every shard reads the whole raw stream (cheap) but cleans and tokenises only the blocks it owns
(`parallel_encode.block_owner`), and writes them unsplit: the train/val split is one seeded
stream over all documents in corpus order, so it is drawn once, by the merge (merge.py), which
then writes exactly the files a one-machine prepare writes. A shard folder:

    meta.json       kind "pretrain_shard" (training refuses it), shard index/count, the recipe
                    every shard must share, and per source the blocks held [block, docs, tokens]
    tokenizer.model the tokenizer (each shard trains the same one, or all reuse tokenizer.path;
                    a reused Hugging Face tokenizer is the folder tokenizer/)
    docs.bin(.json)     uint16 tokens of the owned blocks' documents, the end id after each
    docs.idx.bin(.json) int64 [tokens, characters] per document

Offsets are Python ints from the block table, so files past 2^31 tokens / 4 GiB read as any other.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from anchormass.data.parallel_encode import EncodedBlock, block_owner, raw_blocks
from anchormass.data.token_file import TokenWriter, open_tokens
from anchormass.data.tokenizer_loader import load_tokenizer, tokenizer_in
from anchormass.errors import DataError

SHARD_KIND = "pretrain_shard"
_IDX_LIMIT = 1 << 62  # docs.idx.bin holds counts, not ids: TokenWriter's range check only needs a bound
_ITEM = np.dtype(np.uint16).itemsize


class ShardWriter:
    def __init__(self, out: Path, vocab_size: int, n_parts: int):
        self.docs = TokenWriter(out / "docs.bin", vocab_size)
        self.idx = TokenWriter(out / "docs.idx.bin", _IDX_LIMIT, dtype="int64")
        self.blocks: list[list[list[int]]] = [[] for _ in range(n_parts)]

    def add(self, part: int, block: int, enc: EncodedBlock) -> None:
        if len(enc):  # a block whose texts were all empty holds nothing; the merge skips it too
            self.docs.write(enc.tokens)
            self.idx.write(np.stack([enc.lengths, enc.chars], axis=1).ravel())
        self.blocks[part].append([int(block), len(enc), int(enc.tokens.size)])

    @property
    def documents(self) -> int:
        return sum(n for part in self.blocks for _, n, _ in part)

    def finish(self, side: dict[str, Any]) -> None:
        self.docs.finish(side)
        self.idx.finish({"columns": ["tokens", "characters"]})

    def abort(self) -> None:
        self.docs.abort()
        self.idx.abort()


class ShardReader:
    """A shard folder, checked (sizes against sidecars and the block table); `read(part, block)`."""

    def __init__(self, folder: str | os.PathLike):
        self.root = Path(folder)
        path = self.root / "meta.json"
        try:
            self.meta = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise DataError(f"{self.root}: not a shard folder (cannot read meta.json: {err})") from err
        if self.meta.get("kind") != SHARD_KIND:
            raise DataError(f"{self.root}: not a shard folder (meta.json kind {self.meta.get('kind')!r}, "
                            f"expected {SHARD_KIND!r}; prepare it with data.num_shards=K data.shard_index=i)")
        self.index, self.count = int(self.meta["shard"]["index"]), int(self.meta["shard"]["count"])
        data = self.meta["dataset"]
        self.tokenizer = load_tokenizer(tokenizer_in(self.root, data))
        if self.tokenizer.checksum != data["tokenizer_checksum"]:
            raise DataError(f"{self.root}: {tokenizer_in(self.root, data).name} does not match meta.json "
                            f"(checksum differs)")
        # sizes and sidecars; ids are range-checked again as the merge writes them
        n_tokens = len(open_tokens(self.root / "docs.bin", vocab_size=data["vocab_size"],
                                   tokenizer_checksum=data["tokenizer_checksum"], check_ids=False))
        n_idx = len(open_tokens(self.root / "docs.idx.bin", dtype="int64", check_ids=False))
        self._where: dict[tuple[int, int], tuple[int, int, int, int]] = {}
        docs = tokens = 0
        for part, blocks in enumerate(self.meta["parts"]):
            for block, n_docs, n_tok in blocks["blocks"]:
                self._where[(part, int(block))] = (docs, int(n_docs), tokens, int(n_tok))
                docs, tokens = docs + int(n_docs), tokens + int(n_tok)
        if (tokens, 2 * docs) != (n_tokens, n_idx):
            raise DataError(f"{self.root}: the block table says {tokens} tokens / {docs} documents, the files hold "
                            f"{n_tokens} / {n_idx // 2} (a damaged or mixed shard folder)")

    def has(self, part: int, block: int) -> bool:
        return (part, block) in self._where

    def read(self, part: int, block: int) -> EncodedBlock:
        doc0, n_docs, tok0, n_tok = self._where[(part, block)]
        with open(self.root / "docs.bin", "rb") as fh:
            fh.seek(tok0 * _ITEM)
            tokens = np.frombuffer(fh.read(n_tok * _ITEM), dtype=np.uint16)
        with open(self.root / "docs.idx.bin", "rb") as fh:
            fh.seek(doc0 * 16)
            idx = np.frombuffer(fh.read(n_docs * 16), dtype=np.int64).reshape(-1, 2)
        if tokens.size != n_tok or int(idx[:, 0].sum()) != n_tok:
            raise DataError(f"{self.root}: block {block} of source {part} is damaged (token counts disagree)")
        return EncodedBlock(tokens, idx[:, 0].copy(), idx[:, 1].copy())


def write_shard(out: Path, encoder, parts: list, index: int, count: int, block_docs: int, progress,
                meta: dict[str, Any]) -> dict[str, Any]:
    """Encode the blocks shard `index` of `count` owns into `out`; returns its meta.json.

    A source with a `limit` stops once this shard alone holds `limit` of its documents: the merge
    takes blocks in order, so it has reached the limit before it needs any later block."""
    data = meta["dataset"]
    writer = ShardWriter(out, data["vocab_size"], len(parts))
    part_meta = []
    try:
        for p, part in enumerate(parts):
            seen = {"blocks": 0}

            def owned(p=p, part=part, seen=seen):
                for b, texts in enumerate(raw_blocks(part, block_docs)):
                    seen["blocks"] = b + 1
                    if block_owner(p, b, count) == index:
                        yield b, texts

            own, stopped = 0, False
            for b, enc in encoder.encode(part, owned()):
                writer.add(p, b, enc)
                progress.update(len(enc))
                own += len(enc)
                if part.limit and own >= part.limit:
                    stopped = True
                    break
            part_meta.append({"limit": part.limit, "total_blocks": None if stopped else seen["blocks"],
                              "blocks": writer.blocks[p]})
        if writer.documents == 0:
            total = sum(m["total_blocks"] or 0 for m in part_meta)
            raise DataError(f"shard {index} of {count} got no documents (the corpus has {total} blocks of up to "
                            f"{block_docs} texts); use fewer shards or a smaller data.block_docs")
        writer.finish({"tokenizer_checksum": data["tokenizer_checksum"], "source": data["source"], "shard": index})
    except BaseException:
        writer.abort()
        raise
    finally:
        progress.close()
    return {**meta, "kind": SHARD_KIND, "shard": {"index": index, "count": count},
            "recipe": {**meta["recipe"], "limits": [p.limit for p in parts]}, "parts": part_meta}
