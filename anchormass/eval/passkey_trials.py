"""Passkey trials shared by the suites that score them (passkey, policies, baselines,
recall_frontier): the haystack a config asks for, the (length, depth, seed) grid, greedy
decoding of a batch of trials, and the exact-match tally (docs/method.md §6 c)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from anchormass.errors import ConfigError
from anchormass.eval.answers import score_answer
from anchormass.eval.common import OOM, free_memory, is_oom, progress
from anchormass.eval.haystack import Haystack, Trial, make_trial
from anchormass.eval.suite import EvalContext, EvalModel, Suite
from anchormass.inference.generate import generate

DEFAULT_DEPTHS = [0.1, 0.3, 0.5, 0.7, 0.9]


def build_haystack(suite: Suite, ctx: EvalContext) -> Haystack:
    """The haystack a passkey-style suite's config asks for (filler, language, token file)."""
    tokens = None
    if suite.opt("filler", "classic_ja") == "tokens":
        from anchormass.data.token_file import open_tokens

        path = suite.opt("filler_path") or (ctx.data_dir / "val.bin" if ctx.data_dir else None)
        if not path:
            raise ConfigError(f"{suite.name}: filler=tokens needs filler_path=<token file> or data_dir")
        tokens = open_tokens(Path(str(path)).expanduser(), tokenizer_checksum=getattr(ctx.tokenizer, "checksum", None))
        ctx.record_data(f"{suite.name}_filler", path)
    return Haystack(ctx.tokenizer, filler=suite.opt("filler", "classic_ja"), lang=suite.opt("lang", "ja"),
                    tokens=tokens, bos=bool(suite.opt("bos", False)))


def run_trials(ctx: EvalContext, m: EvalModel, hay: Haystack, trials: list[Trial], *, max_new_tokens: int,
               batch_size: int, policy=None, budget=None, chunk=None, desc: str = "passkey") -> list[dict]:
    """One record per trial: the trial, the decoded output, exact / digits (or status OOM).
    Trials are batched by length (a batch shares one length, as the cache requires)."""
    by_len: dict[int, list[Trial]] = {}
    for t in trials:
        by_len.setdefault(t.length, []).append(t)
    batches = [ts[i:i + batch_size] for ts in by_len.values() for i in range(0, len(ts), batch_size)]
    records: list[dict] = []
    for batch in progress(batches, ctx.progress, f"{desc} [{m.label}]"):
        ids = torch.tensor([hay.build(t) for t in batch], dtype=torch.long, device=ctx.device)
        try:
            new = generate(m.model, ids, max_new_tokens, temperature=0.0, policy=policy, budget=budget,
                           chunk_size=None if chunk is None else int(chunk)).tolist()
        except Exception as err:  # OOM at a length is a result
            if not is_oom(err):
                raise
            free_memory(ctx.device)
            records += [{**t.as_dict(), "model": m.label, "status": OOM, "exact": False, "digits": 0} for t in batch]
            continue
        vocab = ctx.tokenizer.vocab_size
        for t, out in zip(batch, new):
            # a model may emit ids the tokenizer lacks (model vocab > tokenizer vocab): read as unk
            text = ctx.tokenizer.decode([i if i < vocab else ctx.tokenizer.unk_id for i in out])
            records.append({**t.as_dict(), "model": m.label, "status": "ok", "output": text,
                            **score_answer(text, t.key)})
    return records


def trial_grid(lengths, depths, seeds, phrasing: str = "plain") -> list[Trial]:
    return [make_trial(int(L), float(d), int(s), phrasing) for L in lengths for d in depths for s in seeds]


def passkey_setup(owner: str, cfg: dict, ctx: EvalContext, lengths) -> tuple[Haystack, list[Trial], int]:
    """The passkey trials another suite borrows (baselines, recall_frontier): the passkey suite's haystack
    options from `cfg` (filler, lang, filler_path, bos), the (length, depth, seed) grid and the number
    of tokens to decode. Every prompt is built once here, so a too-short length fails before any run."""
    options = Suite(dict(cfg))
    options.name = owner
    hay = build_haystack(options, ctx)
    trials = trial_grid(lengths, cfg.get("depths", DEFAULT_DEPTHS), cfg.get("seeds", [0, 1, 2]))
    for t in trials:
        ctx.check_length(owner, t.length)
        hay.build(t)
    return hay, trials, int(cfg.get("new_tokens", 8))


def tally(records: list[dict]) -> dict:
    n = len(records)
    return {"n": n, "exact": sum(r["exact"] for r in records),
            "digits_mean": float(np.mean([r["digits"] for r in records])) if n else 0.0,
            "oom": sum(r["status"] == OOM for r in records)}
