"""Build a prepared dataset folder from a data config (`configs/data/<name>.yaml`); see dataset_dir.py.

Each kind is its own module with one writer, `write_<kind>(cfg, staging) -> meta`, which `prepare`
picks by the config's `kind` and runs inside staged_folder.build_folder (built beside the target,
renamed into place when complete, one build per target at a time):
    pretrain   pretrain_writer.py   documents -> tokenizer -> train.bin / val.bin (parallel, sharded)
    sft        sft_writer.py        Alpaca records -> the chat template -> tokens + loss mask + offsets
    longctx    longctx_writer.py    retrieval examples over a prepared pretrain folder; sft layout
Same config + inputs -> byte-identical files (no timestamps; fixed seeds; SentencePiece seeded).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from anchormass.config_checks import check_numbers
from anchormass.data.longctx_writer import write_longctx
from anchormass.data.pretrain_writer import write_pretrain
from anchormass.data.sft_writer import write_sft
from anchormass.data.sources import require_readers
from anchormass.data.staged_folder import build_folder
from anchormass.errors import ConfigError
from anchormass.path_checks import check_data_out_dir, check_folder_name

KINDS = {"pretrain": write_pretrain, "sft": write_sft, "longctx": write_longctx}

# Numeric settings read with int()/float() while preparing: a word there is a one-line ConfigError.
_NUMBERS = {"split_seed": int, "val_fraction": float, "tokenizer.vocab_size": int,
            "tokenizer.character_coverage": float, "tokenizer.max_sentences": int, "tokenizer.seed": int,
            "tokenizer.num_threads": int, "num_workers": int, "num_shards": int, "shard_index": int,
            "block_docs": int, "dedup_min_chars": int}


def prepare(cfg: Mapping[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Prepare the dataset `cfg` describes into cfg.out_dir (default data/<name>); returns (folder, meta)."""
    kind = cfg.get("kind", "pretrain")
    if kind not in KINDS:
        raise ConfigError(f"data kind must be one of {sorted(KINDS)}, got {kind!r}")
    if not cfg.get("name"):
        raise ConfigError("data config needs a name")
    check_numbers(cfg, _NUMBERS, label="data.")
    name = check_folder_name(cfg["name"], "data.name")  # data/<name>: never a path out of data/
    out = check_data_out_dir(cfg.get("out_dir") or f"data/{name}")
    shards = int(cfg.get("num_shards") or 1)
    if shards > 1:  # a shard is not a dataset: never where the merged folder goes (merge.py)
        if kind != "pretrain":
            raise ConfigError(f"data.num_shards applies to kind pretrain only (this is {kind}); drop it")
        out = out.with_name(f"{out.name}.shard-{int(cfg.get('shard_index') or 0)}-of-{shards}")
    require_readers(cfg.get("source"))  # a missing library: one line before any folder is made
    return build_folder(out, lambda staging: KINDS[kind](cfg, staging))
