"""Held-out perplexity of the full cache and of AnchorMass cells made from the same weights, in the
ppl suite's form (docs/method.md §6 b): fixed anchors, identical 1,023 targets at every prior
context, per anchor the mean NLL; per cell and length the cell's wins over the full cache, a
two-sided Wilcoxon signed-rank test and Holm's correction across the lengths.

The parallel forward is scored: it equals chunked prefill + decoding at every position (SPEC 2.5)
as long as stage 2 does not fire, which holds while the global slots stay within the model's
slot budget (checked, not assumed: `check_budget`).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from anchormass.errors import ConfigError
from anchormass.eval.report import fmt_p, markdown, paired_nll_by_length
from anchormass.eval.scoring import anchor_nll, target_logprobs


def anchors_key(anchors: list[int], target_len: int, data_sha: str) -> str:
    """What a ppl row depends on besides the model: the token file, the anchors, the target length."""
    return hashlib.sha256(f"{data_sha}|{target_len}|{anchors}".encode()).hexdigest()[:12]


def check_budget(label: str, group_size: int, slot_budget: int, length: int) -> None:
    """Refuse a length at which an AnchorMass cell's global cache would reach stage 2 (the parallel
    forward does not merge under the slot budget; the cache does)."""
    if (length - 1) // max(1, group_size) >= slot_budget:  # at least one sink is never a slot
        raise ConfigError(f"kv_frontier.ppl: at {length:,} tokens {label} would merge slots under its budget "
                          f"({slot_budget}); the parallel forward does not: shorten the contexts")


@torch.no_grad()
def mean_nll(model, tokens, anchors: list[int], context: int, target_len: int) -> list[float]:
    """Per anchor a, the mean NLL of tok[a+1 .. a+target_len-1] given tok[a-context .. ], one anchor at a time."""
    return anchor_nll(lambda ids, start: target_logprobs(model, ids, start), tokens, anchors, context, target_len,
                      1, next(model.parameters()).device)


def report(ppl: dict) -> str:
    """Per cell: PPL of the full cache and of the cell per length, the cell's wins and Holm p."""
    full = ppl["nll"]["standard/full"]
    contexts = [int(c) for c in ppl["contexts"]]
    text = ["### Held-out perplexity (the same weights; full cache against each AnchorMass cell)\n"]
    for cell, by_ctx in ppl["nll"].items():
        if cell == "standard/full":
            continue
        ok = [c for c in contexts if str(c) in by_ctx and str(c) in full]
        tests = paired_nll_by_length({c: full[str(c)] for c in ok}, {c: by_ctx[str(c)] for c in ok})
        body = []
        for c in ok:
            a, b, t = float(np.mean(full[str(c)])), float(np.mean(by_ctx[str(c)])), tests[c]
            body.append([f"{c + ppl['target_len']:,} (prior {c:,})", f"{math.exp(a):.2f}", f"{math.exp(b):.2f}",
                         f"{math.exp(b) - math.exp(a):+.2f}", f"{t['wins_b']} / {t['n']}", fmt_p(t["p_holm"])])
        text.append(f"**{cell}**\n\n" + markdown(["length", "full cache PPL", "cell PPL", "ΔPPL", "cell wins",
                                                   "p (Wilcoxon, Holm)"], body))
    text.append(f"{len(ppl['anchors'])} anchors in {ppl['data']}, {ppl['target_len'] - 1:,} identical target "
                f"tokens per anchor at every length (no bos); PPL = exp(mean over anchors of the mean NLL). Wins: "
                f"anchors where the cell's NLL is lower; two-sided Wilcoxon signed-rank per length, Holm across "
                f"the lengths of that cell.\n")
    return "\n".join(text)
