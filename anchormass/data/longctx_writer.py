"""Kind `longctx`: retrieval examples (longctx.py) over a prepared pretrain folder's train/val tokens,
written in the sft layout with that folder's tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from tqdm import tqdm

from anchormass.data.dataset_dir import PreparedDataset, base_meta
from anchormass.data.longctx import LongContextSpec, build_examples
from anchormass.data.sft_writer import write_sft_split
from anchormass.errors import ConfigError


def write_longctx(cfg: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """Write the long-context folder's files into `out`; returns its meta.json."""
    lcfg = dict(cfg.get("longctx") or {})
    src_dir = lcfg.pop("source_dir", None)
    if not src_dir:
        raise ConfigError(f"data '{cfg['name']}': longctx.source_dir (a prepared pretrain folder) is required")
    counts = {"train": int(lcfg.pop("n_train", 256)), "val": int(lcfg.pop("n_val", 32))}
    seed = int(lcfg.pop("seed", 42))
    spec = LongContextSpec(**lcfg)
    source = PreparedDataset(src_dir)
    tok = source.tokenizer
    tok.save(out)
    desc = f"long-context retrieval over {src_dir} ({spec.n_facts} facts of {list(spec.kinds)}, {spec.length} tokens)"
    splits = {}
    for i, (name, n) in enumerate(counts.items()):
        examples = tqdm(build_examples(source.tokens(name), tok, spec, n, seed + 1000 * i), total=n,
                        desc=f"longctx {name}", unit="example")
        splits[name] = write_sft_split(out, name, examples, tok, {"source": desc})
    spec_meta = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(spec).items()}
    return {**base_meta(cfg, "sft", tok, desc), "longctx": {**spec_meta, "seed": seed}, "splits": splits}
