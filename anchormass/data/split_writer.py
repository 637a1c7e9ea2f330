"""train.bin / val.bin of a pretrain folder, written as encoded documents arrive in corpus order.

Each document goes to val when the next draw of one seeded stream says so (one draw per
document, in order), so the split depends only on the corpus order and the seed: the same for a
streaming source, for any number of workers, and for shards merged afterwards (merge.py).
Tokens are appended to temp files as they come (token_file.TokenWriter); nothing is held.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from anchormass.data.parallel_encode import EncodedBlock
from anchormass.data.token_file import TokenWriter
from anchormass.errors import ConfigError, DataError

SPLITS = ("train", "val")


def split_stream(seed: int, val_fraction: float) -> Callable[[], bool]:
    """Call once per document, in order: True = val. One seeded stream, so streaming sources work."""
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError(f"val_fraction must be in (0, 1), got {val_fraction}")
    rng = np.random.default_rng(seed)
    return lambda: bool(rng.random() < val_fraction)


class SplitWriter:
    def __init__(self, out: Path, vocab_size: int, tokenizer_checksum: str, source: str, seed: int,
                 val_fraction: float):
        self.is_val = split_stream(seed, val_fraction)
        self.val_fraction, self.checksum, self.source = val_fraction, tokenizer_checksum, source
        self.writers = {s: TokenWriter(out / f"{s}.bin", vocab_size) for s in SPLITS}
        self.stats = {s: {"documents": 0, "characters": 0} for s in SPLITS}

    def add(self, block: EncodedBlock) -> None:
        if not len(block):
            return
        val = np.fromiter((self.is_val() for _ in range(len(block))), dtype=bool, count=len(block))
        per_token = np.repeat(val, block.lengths)
        for split, docs, toks in (("train", ~val, ~per_token), ("val", val, per_token)):
            if docs.any():
                self.writers[split].write(block.tokens[toks])
                self.stats[split]["documents"] += int(docs.sum())
                self.stats[split]["characters"] += int(block.chars[docs].sum())

    def finish(self) -> dict[str, Any]:
        """Per split: documents, characters, tokens, chars_per_token (meta.json's `splits`)."""
        for split, st in self.stats.items():
            if st["documents"] == 0:
                raise DataError(f"the {split} split got no documents "
                                f"({sum(s['documents'] for s in self.stats.values())}"
                                f" in the corpus, val_fraction {self.val_fraction}); the corpus is empty or too small")
        sides = {s: w.finish({"tokenizer_checksum": self.checksum, "source": self.source, "split": s})
                 for s, w in self.writers.items()}
        for s, st in self.stats.items():
            st["tokens"] = sides[s]["tokens"]
            st["chars_per_token"] = round(st["characters"] / max(1, st["tokens"]), 4)
        return self.stats

    def abort(self) -> None:
        for w in self.writers.values():
            w.abort()
