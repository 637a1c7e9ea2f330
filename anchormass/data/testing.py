"""Tiny prepared datasets for tests (here and in other packages' tests): seconds, offline, deterministic."""

from __future__ import annotations

from pathlib import Path

from anchormass.data.prepare import prepare


def tiny_pretrain(out_dir: str | Path, seed: int = 3, n_docs: int = 10) -> Path:
    """A pretrain folder from the synthetic demo grammar: ~20K train tokens, vocab 400."""
    return prepare({"name": Path(out_dir).name, "kind": "pretrain", "out_dir": str(out_dir), "val_fraction": 0.2,
                    "source": {"kind": "demo", "params": {"n_docs": n_docs, "seed": seed, "min_sentences": 30,
                                                          "max_sentences": 60}},
                    "tokenizer": {"vocab_size": 400, "model_type": "bpe"}})[0]

