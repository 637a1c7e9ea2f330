"""Paired statistics (SPEC 6 b, e). Distributions come from scipy; only the bookkeeping is ours."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import stats


def wilcoxon_exact(diffs: Sequence[float]) -> float:
    """Exact two-sided Wilcoxon signed-rank p for paired differences (zeros dropped, as Wilcoxon
    did). All-zero or empty input has no evidence either way: p = 1."""
    d = np.asarray(diffs, dtype=np.float64)
    d = d[d != 0]
    if d.size == 0:
        return 1.0
    return float(stats.wilcoxon(d, alternative="two-sided", method="exact").pvalue)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, returned in the input order."""
    p = np.asarray(pvalues, dtype=np.float64)
    m = p.size
    order = np.argsort(p, kind="stable")
    adjusted = np.empty(m)
    running = 0.0
    for rank, idx in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[idx]))
        adjusted[idx] = running
    return adjusted.tolist()


def paired_nll_by_length(nll_a: dict, nll_b: dict) -> dict:
    """Per length: wins for B (#(d_i > 0), d_i = NLL_A - NLL_B), the exact Wilcoxon p and the Holm
    p across all lengths. nll_a / nll_b: {length: [mean NLL per anchor]} over identical anchors."""
    lengths = list(nll_a)
    rows = {}
    for L in lengths:
        a, b = np.asarray(nll_a[L], dtype=np.float64), np.asarray(nll_b[L], dtype=np.float64)
        if a.shape != b.shape:
            raise ValueError(f"length {L}: {a.size} vs {b.size} anchors; pairs must match")
        d = a - b
        rows[L] = {"n": int(d.size), "wins_b": int((d > 0).sum()), "losses_b": int((d < 0).sum()),
                   "mean_diff": float(d.mean()) if d.size else math.nan,
                   "p_wilcoxon": wilcoxon_exact(d)}
    for L, p_holm in zip(lengths, holm([rows[L]["p_wilcoxon"] for L in lengths])):
        rows[L]["p_holm"] = p_holm
    return rows


def mcnemar_exact(correct_a: Sequence[bool], correct_b: Sequence[bool]) -> dict:
    """Exact McNemar: p = min(1, 2 * BinomCDF(min(b, c); b + c, 1/2)) over the discordant pairs
    (b: A right and B wrong, c: A wrong and B right)."""
    a = np.asarray(correct_a, dtype=bool)
    bb = np.asarray(correct_b, dtype=bool)
    if a.shape != bb.shape:
        raise ValueError(f"McNemar needs paired vectors, got {a.size} and {bb.size}")
    b = int((a & ~bb).sum())
    c = int((~a & bb).sum())
    return {"b": b, "c": c, "p": mcnemar_p(b, c)}


def mcnemar_p(b: int, c: int) -> float:
    if b + c == 0:
        return 1.0
    return float(stats.binomtest(min(b, c), b + c, 0.5, alternative="two-sided").pvalue)
