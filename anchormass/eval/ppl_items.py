"""The perplexity items (docs/method.md §6 b), shared by suite=ppl and suite=baselines: the token
file a config names, its contexts and target length, and the fixed anchors (drawn once,
deterministically, or pinned with `anchors: [...]`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from anchormass.errors import ConfigError, DataError
from anchormass.eval.suite import EvalContext


@dataclass
class PplItems:
    tokens: Any  # the token file's ids (a memmap)
    anchors: list[int]
    contexts: list[int]
    target_len: int


def draw_anchors(n_tokens: int, lo: int, target_len: int, n: int, seed: int) -> list[int]:
    """n anchors in [lo, n_tokens - target_len], one per equal stratum: deterministic, spread out."""
    hi = n_tokens - target_len  # inclusive
    if hi - lo + 1 < n:
        raise DataError(f"ppl: token file has {n_tokens} tokens; {n} anchors need contexts of {lo} plus "
                        f"{target_len} targets each (at least {lo + target_len + n - 1} tokens)")
    rng = np.random.default_rng(seed)
    edges = np.linspace(lo, hi + 1, n + 1).astype(np.int64)
    return [int(rng.integers(edges[i], max(edges[i] + 1, edges[i + 1]))) for i in range(n)]


def data_path(cfg: dict, ctx: EvalContext) -> Path:
    """`data=` of the ppl config, else val.bin in the run's data_dir."""
    if cfg.get("data"):
        return Path(str(cfg.get("data"))).expanduser()
    if ctx.data_dir is not None:
        return Path(ctx.data_dir) / "val.bin"
    raise ConfigError("ppl needs a token file: eval.ppl.data=<val.bin> or data_dir=<folder>")


def ppl_items(cfg: dict, ctx: EvalContext) -> PplItems:
    """The ppl config's items, every input checked (lengths, vocab, tokenizer checksum, anchors)
    and the token file recorded, before anything runs."""
    from anchormass.data.token_file import open_tokens, read_sidecar

    contexts = [int(c) for c in cfg.get("contexts", [0, 1024, 3072, 7168, 15360, 31744])]
    target_len = int(cfg.get("target_len", 1024))
    if target_len < 2 or any(c < 0 for c in contexts) or not contexts:
        raise ConfigError("ppl: target_len must be >= 2 and contexts non-empty and >= 0")
    if cfg.get("mode", "parallel") not in ("parallel", "cached"):
        raise ConfigError(f"ppl.mode must be parallel or cached, got {cfg.get('mode')!r}")
    for c in contexts:
        ctx.check_length("ppl", c + target_len)
    path = data_path(cfg, ctx)
    meta = read_sidecar(path)
    for m in ctx.models:
        if int(meta["vocab_size"]) > m.config.vocab_size:
            raise DataError(f"ppl: {path.name} has vocab {meta['vocab_size']} but model '{m.label}' only "
                            f"{m.config.vocab_size}: data and checkpoint do not match")
    want = getattr(ctx.tokenizer, "checksum", None)
    tokens = open_tokens(path, tokenizer_checksum=want if meta.get("tokenizer_checksum") else None)
    ctx.record_data("ppl", path)
    lo = max(contexts)
    if cfg.get("anchors"):
        anchors = [int(a) for a in cfg.get("anchors")]
        bad = [a for a in anchors if a < lo or a + target_len > len(tokens)]
        if bad:
            raise DataError(f"ppl: anchors {bad} fall outside [{lo}, {len(tokens) - target_len}]")
    else:
        anchors = draw_anchors(len(tokens), lo, target_len, int(cfg.get("n_anchors", 10)),
                               int(cfg.get("anchor_seed", 0)))
    return PplItems(tokens=tokens, anchors=anchors, contexts=contexts, target_len=target_len)
