"""Build a prepared dataset folder from a data config (`configs/data/<name>.yaml`); see dataset_dir.py.

Kinds:
- pretrain: documents (sources.py) -> cleaners -> train/val split by document (seeded) ->
  tokenizer trained on the train documents (or reused) -> train.bin / val.bin, eos after each document.
  Cleaning + encoding run in `num_workers` processes (parallel_encode.py), streamed, in corpus
  order; `num_shards=K shard_index=i` writes shard i of K (shards.py) for merge.py to join.
  The files are byte-identical for every num_workers, and merged shards equal a one-machine run.
- sft: Alpaca records -> the chat template (sft.py) -> tokens + loss mask + offsets; reuses a tokenizer.
- longctx: retrieval examples over a prepared pretrain folder's train/val tokens (longctx.py); sft layout.

Everything is built in a staging folder beside the target and renamed into place at the end, so a
failure leaves no partial output and an existing folder is replaced only by a complete one. One
prepare per target at a time (a lock beside it); staging folders that a killed prepare left
behind are removed by the next one.
Same config + inputs -> byte-identical files (no timestamps; fixed seeds; SentencePiece seeded).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from tqdm import tqdm

from anchormass.config_checks import check_numbers
from anchormass.data.dataset_dir import PreparedDataset
from anchormass.data.longctx import LongContextSpec, build_examples
from anchormass.data.parallel_encode import BLOCK_DOCS, BlockEncoder, limited, raw_blocks
from anchormass.data.sft import alpaca_records, pack_examples, render_example
from anchormass.data.shards import SHARD_KIND, ShardReader, write_shard
from anchormass.data.sources import describe, iter_documents, iter_records, source_parts
from anchormass.data.split_writer import SplitWriter, split_stream
from anchormass.data.token_file import write_tokens
from anchormass.data.tokenizer import Tokenizer, train_tokenizer
from anchormass.dir_lock import DirLock
from anchormass.errors import ConfigError, DataError
from anchormass.path_checks import check_data_out_dir, check_folder_name
from anchormass.utils import atomic_write_bytes, atomic_write_json, current_umask, resolve_path, writable_dir


def _tokenizer(cfg: Mapping[str, Any], out: Path, train_texts: Callable[[], Iterable[str]]) -> Tokenizer:
    tcfg = dict(cfg.get("tokenizer") or {})
    if tcfg.get("path"):
        tok = Tokenizer.load(resolve_path(tcfg["path"]))
        atomic_write_bytes(out / "tokenizer.model", resolve_path(tcfg["path"]).read_bytes())
        return tok
    return train_tokenizer(
        train_texts(), out / "tokenizer.model", int(tcfg.get("vocab_size", 28_000)),
        model_type=tcfg.get("model_type", "unigram"), character_coverage=float(tcfg.get("character_coverage", 0.9995)),
        max_sentences=int(tcfg.get("max_sentences", 2_000_000)), seed=int(tcfg.get("seed", 42)),
        num_threads=int(tcfg.get("num_threads", 1)), hard_vocab_limit=bool(tcfg.get("hard_vocab_limit", True)))


def _base_meta(cfg: Mapping[str, Any], kind: str, tok: Tokenizer, source: str) -> dict[str, Any]:
    return {"name": cfg["name"], "kind": kind, "vocab_size": tok.vocab_size, "tokenizer": "tokenizer.model",
            "tokenizer_checksum": tok.checksum, "special_ids": tok.special_ids(), "source": source}


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


def _prepare_pretrain(cfg: Mapping[str, Any], out: Path) -> dict[str, Any]:
    src, cleaners = cfg["source"], cfg.get("cleaners")
    seed, val_fraction = int(cfg.get("split_seed", 42)), float(cfg.get("val_fraction", 0.05))
    workers, shards, index, block_docs = _parallel_settings(cfg)
    split_stream(seed, val_fraction)  # checks val_fraction now: a shard run draws no split itself

    def split_docs(want_val: bool) -> Iterator[str]:
        docs, _ = iter_documents(src, cleaners)
        is_val = split_stream(seed, val_fraction)
        return (d for d in docs if is_val() == want_val)

    max_docs = (cfg.get("tokenizer") or {}).get("max_docs")
    tok = _tokenizer(cfg, out, lambda: tqdm(split_docs(False) if not max_docs else
                                            (d for _, d in zip(range(int(max_docs)), split_docs(False))),
                                            desc="tokenizer docs", unit="doc", leave=False))
    parts = source_parts(src, cleaners)
    desc = describe(parts)
    base = _base_meta(cfg, "pretrain", tok, desc)
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


def _write_sft_split(out: Path, split: str, examples, tok: Tokenizer, extra: dict, max_tokens=None) -> dict:
    tokens, mask, offsets, dropped = pack_examples(examples, max_tokens)
    side = {"tokenizer_checksum": tok.checksum, "split": split, **extra}
    write_tokens(out / f"{split}.bin", tokens, tok.vocab_size, side)
    write_tokens(out / f"{split}.mask.bin", mask, 2, {"split": split}, dtype="uint8")
    write_tokens(out / f"{split}.idx.bin", offsets, len(tokens) + 1, {"split": split}, dtype="int64")
    return {"examples": len(offsets) - 1, "tokens": len(tokens), "loss_tokens": int(mask.sum()),
            "dropped_too_long": dropped}


def _need_tokenizer(cfg: Mapping[str, Any], out: Path) -> Tokenizer:
    if not (cfg.get("tokenizer") or {}).get("path"):
        raise ConfigError(f"data '{cfg['name']}': tokenizer.path is required (the pretraining tokenizer)")
    return _tokenizer(cfg, out, lambda: [])


def _prepare_sft(cfg: Mapping[str, Any], out: Path) -> dict[str, Any]:
    tok = _need_tokenizer(cfg, out)
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
    splits = {name: _write_sft_split(out, name, exs, tok, {"source": desc}, max_tokens) for name, exs in split.items()}
    return {**_base_meta(cfg, "sft", tok, desc), "template": "chat-v1 (anchormass.data.sft)", "system": system,
            "splits": splits}


def _prepare_longctx(cfg: Mapping[str, Any], out: Path) -> dict[str, Any]:
    lcfg = dict(cfg.get("longctx") or {})
    src_dir = lcfg.pop("source_dir", None)
    if not src_dir:
        raise ConfigError(f"data '{cfg['name']}': longctx.source_dir (a prepared pretrain folder) is required")
    counts = {"train": int(lcfg.pop("n_train", 256)), "val": int(lcfg.pop("n_val", 32))}
    seed = int(lcfg.pop("seed", 42))
    spec = LongContextSpec(**lcfg)
    source = PreparedDataset(src_dir)
    tok = source.tokenizer
    atomic_write_bytes(out / "tokenizer.model", (source.root / "tokenizer.model").read_bytes())
    desc = f"long-context retrieval over {src_dir} ({spec.n_facts} facts of {list(spec.kinds)}, {spec.length} tokens)"
    splits = {}
    for i, (name, n) in enumerate(counts.items()):
        examples = tqdm(build_examples(source.tokens(name), tok, spec, n, seed + 1000 * i), total=n,
                        desc=f"longctx {name}", unit="example")
        splits[name] = _write_sft_split(out, name, examples, tok, {"source": desc})
    spec_meta = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(spec).items()}
    return {**_base_meta(cfg, "sft", tok, desc), "longctx": {**spec_meta, "seed": seed}, "splits": splits}


_KINDS = {"pretrain": _prepare_pretrain, "sft": _prepare_sft, "longctx": _prepare_longctx}


# Numeric settings read with int()/float() while preparing: a word there is a one-line ConfigError.
_NUMBERS = {"split_seed": int, "val_fraction": float, "tokenizer.vocab_size": int,
            "tokenizer.character_coverage": float, "tokenizer.max_sentences": int, "tokenizer.seed": int,
            "tokenizer.num_threads": int, "num_workers": int, "num_shards": int, "shard_index": int,
            "block_docs": int}


def prepare(cfg: Mapping[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Prepare the dataset `cfg` describes into cfg.out_dir (default data/<name>); returns (folder, meta)."""
    kind = cfg.get("kind", "pretrain")
    if kind not in _KINDS:
        raise ConfigError(f"data kind must be one of {sorted(_KINDS)}, got {kind!r}")
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
    return build_folder(out, lambda staging: _KINDS[kind](cfg, staging))


def build_folder(out: Path, build: Callable[[Path], dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """`build(staging)` writes a folder's files and returns its meta.json; the folder is then
    checked and renamed to `out` (replacing the old one), under `out`'s lock. Returns (out, meta)."""
    # The folder is replaced wholesale at the end: never a file, nor a folder that is not a dataset.
    if out.exists() and not (out.is_dir() and ((out / "meta.json").is_file() or not any(out.iterdir()))):
        raise ConfigError(f"out_dir {out} exists and is not a prepared dataset folder; refusing to replace it")
    writable_dir(out.parent, f"data.out_dir={out}: its folder")
    with DirLock(out.parent / f".{out.name}.lock", what=f"dataset folder {out}"):
        return _build_locked(out, build)


def _remove_leftovers(out: Path) -> None:
    """Staging and replaced folders of this target: while we hold its lock no other prepare is
    writing one, so any that exist were left by a prepare that was killed."""
    for pattern in (f".{out.name}.staging-*", f".{out.name}.old-*"):
        for path in out.parent.glob(pattern):
            shutil.rmtree(path, ignore_errors=True)


def _build_locked(out: Path, build: Callable[[Path], dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    _remove_leftovers(out)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
    t0 = time.perf_counter()
    try:
        meta = build(staging)
        atomic_write_json(staging / "meta.json", meta, sort_keys=True, indent=2)
        (ShardReader if meta["kind"] == SHARD_KIND else PreparedDataset)(staging)  # re-open, check all we wrote
        os.chmod(staging, 0o777 & ~current_umask())  # mkdtemp makes it 0700
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        if out.exists():
            os.replace(out, old)
        os.replace(staging, out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    meta["seconds"] = round(time.perf_counter() - t0, 2)  # reported, not written (files stay identical)
    return out, meta
