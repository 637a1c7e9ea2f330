"""A prepared dataset folder `data/<name>/` and its metadata.

    tokenizer.model          SentencePiece model (tokenizer.py), or
    tokenizer/               an imported Hugging Face tokenizer folder (hf_tokenizer.py)
    meta.json                name, kind (pretrain | sft), vocab_size, tokenizer (which of the two),
                             tokenizer kind and checksum, special ids,
                             source description, per-split token counts
    <split>.bin(.json)       uint16 tokens + sidecar, split in {train, val}
    <split>.mask.bin(.json)  sft only: uint8 loss mask, 1 where the token is a loss target
    <split>.idx.bin(.json)   sft only: int64 example offsets into <split>.bin (n_examples + 1)

`fingerprint` hashes what defines the data (vocab, tokenizer checksum, names, token counts and
content hashes of the split's files, all from sidecars) for checkpoints and resume checks.
`verify_dataset` re-hashes every split's files against those sidecar hashes: the full check a
training run makes when it starts (opening a file only checks its size).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from anchormass.command_names import command
from anchormass.data.token_file import open_tokens, read_sidecar, verify_token_file
from anchormass.data.tokenizer_base import TokenizerBase
from anchormass.data.tokenizer_loader import load_tokenizer, tokenizer_in
from anchormass.errors import DataError
from anchormass.utils import resolve_path

KINDS = ("pretrain", "sft")


def split_files(kind: str, split: str) -> list[str]:
    return [f"{split}.bin"] + ([f"{split}.mask.bin", f"{split}.idx.bin"] if kind == "sft" else [])


def read_metadata(data_dir: str | Path) -> dict[str, Any]:
    """meta.json of a prepared folder; `vocab_size` there is what the model's vocab must be."""
    path = resolve_path(data_dir) / "meta.json"
    if not path.is_file():
        raise DataError(f"{resolve_path(data_dir)} is not a prepared dataset (no meta.json); "
                        f"run {command('scripts/prepare_data.py')} first")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: invalid JSON ({err.msg})") from err
    if meta.get("kind") not in KINDS:
        raise DataError(f"{path}: kind must be one of {KINDS}, got {meta.get('kind')!r}")
    return meta


def base_meta(cfg: Mapping[str, Any], kind: str, tok: TokenizerBase, source: str) -> dict[str, Any]:
    """The meta.json fields every kind writes (each adds its splits and own fields)."""
    return {"name": cfg["name"], "kind": kind, "vocab_size": tok.vocab_size, "tokenizer": tok.file_name,
            "tokenizer_kind": tok.kind, "tokenizer_checksum": tok.checksum, "special_ids": tok.special_ids(),
            "source": source}


def fingerprint(data_dir: str | Path, split: str = "train") -> str:
    root = resolve_path(data_dir)
    meta = read_metadata(root)
    parts = {"vocab_size": meta["vocab_size"], "tokenizer_checksum": meta["tokenizer_checksum"], "files": {}}
    for name in split_files(meta["kind"], split):
        side = read_sidecar(root / name)
        parts["files"][name] = {"tokens": side["tokens"], "sha256": side.get("sha256")}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def verify_dataset(data_dir: str | Path) -> None:
    """Full content check of a prepared folder: each split's files against their sidecars' sha256
    (DataError naming the file and telling to re-run prepare_data)."""
    root = resolve_path(data_dir)
    meta = read_metadata(root)
    for split in meta.get("splits", {}):
        for name in split_files(meta["kind"], split):
            if (root / name).is_file():  # a missing file is open_tokens' error, with its own message
                verify_token_file(root / name)


class PreparedDataset:
    """Opens and cross-checks one prepared folder: tokenizer checksum, sidecars, sizes, id ranges."""

    def __init__(self, data_dir: str | Path):
        self.root = resolve_path(data_dir)
        self.meta = read_metadata(self.root)
        self.kind = self.meta["kind"]
        self.vocab_size = int(self.meta["vocab_size"])
        self.tokenizer_path = tokenizer_in(self.root, self.meta)
        self.tokenizer = load_tokenizer(self.tokenizer_path)
        if self.tokenizer.checksum != self.meta["tokenizer_checksum"]:
            raise DataError(f"{self.root}: {self.tokenizer_path.name} does not match meta.json (checksum differs)")
        if self.tokenizer.vocab_size != self.vocab_size:
            raise DataError(f"{self.root}: tokenizer has {self.tokenizer.vocab_size} pieces, meta.json says "
                            f"{self.vocab_size}")

    def tokens(self, split: str) -> np.memmap:
        return open_tokens(self.root / f"{split}.bin", vocab_size=self.vocab_size,
                           tokenizer_checksum=self.tokenizer.checksum)

    def sft_arrays(self, split: str) -> tuple[np.memmap, np.ndarray]:
        """(loss mask, example offsets), checked against the split's token file."""
        n = len(self.tokens(split))
        mask = open_tokens(self.root / f"{split}.mask.bin", dtype="uint8")
        offsets = np.asarray(open_tokens(self.root / f"{split}.idx.bin", dtype="int64"))
        if len(mask) != n:
            raise DataError(f"{split}.mask.bin has {len(mask)} entries for {n} tokens")
        if offsets[0] != 0 or offsets[-1] != n or np.any(np.diff(offsets) < 2):
            raise DataError(f"{split}.idx.bin: offsets must rise from 0 to {n} in steps >= 2")
        return mask, offsets

    def fingerprint(self, split: str = "train") -> str:
        return fingerprint(self.root, split)
