"""Data pipeline (docs/method.md §4): tokenizer, token files, prepared dataset folders, step-indexed DataModules.

    prepare.py       data config -> data/<name>/ (scripts/prepare_data.py is its CLI)
    tokenizer.py     SentencePiece with reserved pad/unk/bos/eos and chat-role ids
    token_file.py    uint16 .bin + JSON sidecar; open_tokens() validates
    dataset_dir.py   a prepared folder: meta.json, read_metadata(), fingerprint()
    sources.py       corpora through `datasets` (local files, hub); cleaners.py; demo_corpus.py
    sampler.py       the global order: step k -> sample ids, rank/micro-batch slicing
    samples.py, loader.py, datamodule.py   sample sets, loaders, LightningDataModules
    sft.py, longctx.py                     chat template + Alpaca; long-context retrieval examples
"""

from __future__ import annotations

from typing import Any


def read_metadata(data_dir) -> dict[str, Any]:
    """meta.json of a prepared folder (vocab_size, kind, tokenizer checksum, special ids, ...)."""
    from anchormass.data.dataset_dir import read_metadata as _read

    return _read(data_dir)

