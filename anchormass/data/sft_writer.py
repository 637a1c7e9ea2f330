"""Kind `sft`: Alpaca records -> the chat template (sft.py) -> tokens + loss mask + offsets, split
train/val (seeded); reuses the pretraining tokenizer. `write_sft_split` writes one split in the
sft layout (dataset_dir.py), which longctx_writer.py uses too."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from tqdm import tqdm

from anchormass.data.dataset_dir import base_meta
from anchormass.data.sft import alpaca_records, pack_examples, render_example
from anchormass.data.sources import iter_records
from anchormass.data.split_writer import split_stream
from anchormass.data.token_file import write_tokens
from anchormass.data.tokenizer_base import TokenizerBase
from anchormass.data.tokenizer_loader import given_tokenizer
from anchormass.errors import DataError


def write_sft_split(out: Path, split: str, examples, tok: TokenizerBase, extra: dict, max_tokens=None) -> dict:
    tokens, mask, offsets, dropped = pack_examples(examples, max_tokens)
    side = {"tokenizer_checksum": tok.checksum, "split": split, **extra}
    write_tokens(out / f"{split}.bin", tokens, tok.vocab_size, side)
    write_tokens(out / f"{split}.mask.bin", mask, 2, {"split": split}, dtype="uint8")
    write_tokens(out / f"{split}.idx.bin", offsets, len(tokens) + 1, {"split": split}, dtype="int64")
    return {"examples": len(offsets) - 1, "tokens": len(tokens), "loss_tokens": int(mask.sum()),
            "dropped_too_long": dropped}


def write_sft(cfg: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """Write the sft folder's files into `out`; returns its meta.json."""
    tok = given_tokenizer(cfg, out)
    rows, desc = iter_records(cfg["source"])
    is_val = split_stream(int(cfg.get("split_seed", 42)), float(cfg.get("val_fraction", 0.05)))
    system = cfg.get("system")
    split = {"train": [], "val": []}
    for rec in tqdm(alpaca_records(rows, cfg.get("fields")), desc="render", unit="example"):
        ex = render_example(tok, rec["instruction"], rec["input"], rec["output"], system)
        split["val" if is_val() else "train"].append(ex)
    for name, exs in split.items():
        if not exs:
            raise DataError(f"the {name} split got no instruction examples (empty or too small input)")
    max_tokens = cfg.get("max_tokens")
    splits = {name: write_sft_split(out, name, exs, tok, {"source": desc}, max_tokens) for name, exs in split.items()}
    template = "the tokenizer's own (its chat template)" if tok.chat_template else "chat-v1 (anchormass.data.sft)"
    return {**base_meta(cfg, "sft", tok, desc), "template": template, "system": system,
            "splits": splits}
