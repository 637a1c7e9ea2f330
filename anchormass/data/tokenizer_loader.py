"""The one way a tokenizer is opened, picked by what its path is (tokenizer_base.py):

    a file (tokenizer.model)              the project's SentencePiece tokenizer (tokenizer.py)
    a folder holding tokenizer.json       an imported Hugging Face tokenizer (hf_tokenizer.py)

A prepared dataset keeps a copy of its tokenizer under the name meta.json's "tokenizer" gives
(`tokenizer.model`, or the folder `tokenizer/`); `dataset_tokenizer` makes that copy, or trains a
SentencePiece model, while a dataset is prepared.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from anchormass.data.hf_tokenizer import TOKENIZER_FILE, HFTokenizer, is_hf_folder
from anchormass.data.tokenizer import Tokenizer, train_tokenizer
from anchormass.data.tokenizer_base import TokenizerBase
from anchormass.errors import ConfigError, DataError
from anchormass.utils import resolve_path


def load_tokenizer(path: str | os.PathLike) -> TokenizerBase:
    path = Path(path)
    if path.is_file():
        return Tokenizer.load(path)
    if is_hf_folder(path):
        return HFTokenizer.load(path)
    if path.is_dir():
        raise DataError(f"tokenizer {path} is a folder without {TOKENIZER_FILE} (a Hugging Face tokenizer folder "
                        f"has one; a SentencePiece tokenizer is a .model file)")
    raise DataError(f"tokenizer not found: {path}")


def tokenizer_in(folder: str | os.PathLike, meta: Mapping[str, Any]) -> Path:
    """Where a prepared (or shard) folder keeps its tokenizer; folders from before meta.json named
    it hold tokenizer.model."""
    name = str(meta.get("tokenizer") or Tokenizer.file_name)
    if name not in (Tokenizer.file_name, HFTokenizer.file_name):
        raise DataError(f"{folder}/meta.json: tokenizer must be {Tokenizer.file_name} or {HFTokenizer.file_name}, "
                        f"got {name!r}")
    return Path(folder) / name


def dataset_tokenizer(cfg: Mapping[str, Any], out: Path, train_texts: Callable[[], Iterable[str]]) -> TokenizerBase:
    """The tokenizer of a dataset being prepared into `out`: the one at cfg.tokenizer.path (a
    SentencePiece file or a Hugging Face folder, copied in), or a SentencePiece model trained on
    `train_texts()` with cfg.tokenizer's settings."""
    tcfg = dict(cfg.get("tokenizer") or {})
    if tcfg.get("path"):
        tok = load_tokenizer(resolve_path(tcfg["path"]))
        tok.save(out)
        return tok
    return train_tokenizer(
        train_texts(), out / Tokenizer.file_name, int(tcfg.get("vocab_size", 28_000)),
        model_type=tcfg.get("model_type", "unigram"), character_coverage=float(tcfg.get("character_coverage", 0.9995)),
        max_sentences=int(tcfg.get("max_sentences", 2_000_000)), seed=int(tcfg.get("seed", 42)),
        num_threads=int(tcfg.get("num_threads", 1)), hard_vocab_limit=bool(tcfg.get("hard_vocab_limit", True)))


def given_tokenizer(cfg: Mapping[str, Any], out: Path) -> TokenizerBase:
    """The pretraining tokenizer a derived dataset (sft) must reuse: cfg.tokenizer.path is required."""
    if not (cfg.get("tokenizer") or {}).get("path"):
        raise ConfigError(f"data '{cfg['name']}': tokenizer.path is required (the pretraining tokenizer)")
    return dataset_tokenizer(cfg, out, lambda: [])


def document_end_id(cfg: Mapping[str, Any], tok: TokenizerBase) -> int:
    """The id after each document: cfg.tokenizer.document_end (a token's text) if set, else eos.
    An imported chat model's eos ends a turn (SmolLM2-Instruct: <|im_end|>), while its pretraining
    separated documents with another token (<|endoftext|>): the data config says which."""
    text = (cfg.get("tokenizer") or {}).get("document_end")
    if not text:
        return tok.eos_id
    i = tok.token_id(str(text))
    if i is None:
        raise ConfigError(f"data.tokenizer.document_end {text!r} is not a token of {tok.path}")
    return i
