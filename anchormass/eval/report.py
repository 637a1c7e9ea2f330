"""What the reports are made of: Markdown tables in the write-up's layout (one row per length /
cell), paired statistics (docs/method.md §6 b, e; distributions from scipy, only the bookkeeping
is ours), summaries over seeds, and PNG figures (matplotlib, Agg backend: no display needed).

A suite's figure goes into the runner's staging folder, which is renamed into place only when
the whole run succeeded.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
import numpy as np  # noqa: E402
from scipy import stats  # noqa: E402

KIB = 1024  # bytes per KiB: the unit of the reports' KV-memory columns


def markdown(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """First column left-aligned, the rest right-aligned (they hold numbers)."""
    align = [":---"] + ["---:"] * (len(head) - 1)
    lines = ["| " + " | ".join(map(str, head)) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def pct(hits: int, n: int) -> str:
    """'80.0% (12/15)' as in the write-up."""
    return f"{100.0 * hits / n:.1f}% ({hits}/{n})" if n else "-"


def fmt_p(p: float) -> str:
    return f"{p:.4f}" if p >= 1e-3 else f"{p:.2e}"


# Paired statistics.

# Largest n whose 2^n sign flips the tied-rank permutation test enumerates (as a sum distribution).
MAX_PERMUTATION_N = 25


def wilcoxon_signed_rank(diffs: Sequence[float]) -> tuple[float, str]:
    """Two-sided Wilcoxon signed-rank p for paired differences (zeros dropped, as Wilcoxon did) and
    the method that produced it.

    Without tied |d| scipy's exact null distribution is exact ("exact"). With ties it is not (it
    assumes the ranks 1..n), so the p-value comes from the permutation distribution of the
    midrank statistic over all 2^n sign flips ("permutation", n <= MAX_PERMUTATION_N); beyond that
    scipy's normal approximation with tie correction ("normal"). All-zero or empty input has no
    evidence either way: p = 1 ("none"). A non-finite difference (a model that scored nan) has no
    rank: p = nan ("non-finite"), not scipy's ValueError."""
    d = np.asarray(diffs, dtype=np.float64)
    if not np.isfinite(d).all():
        return math.nan, "non-finite"
    d = d[d != 0]
    if d.size == 0:
        return 1.0, "none"
    a = np.abs(d)
    if np.unique(a).size == a.size:
        return float(stats.wilcoxon(d, alternative="two-sided", method="exact").pvalue), "exact"
    if d.size <= MAX_PERMUTATION_N:
        return sign_flip_p(d), "permutation"
    return float(stats.wilcoxon(d, alternative="two-sided", method="approx").pvalue), "normal"


def sign_flip_p(d: np.ndarray) -> float:
    """Exact two-sided p of W+ (sum of the midranks of positive d) under the null that every sign
    is a fair coin: all 2^n flips are counted through the distribution of subset sums of the
    doubled midranks (integers), so no flip is sampled and no float sum is compared."""
    ranks2 = np.rint(2 * stats.rankdata(np.abs(d))).astype(np.int64)  # midranks are multiples of 1/2
    counts = np.zeros(int(ranks2.sum()) + 1, dtype=object)  # object: exact integers up to 2^n
    counts[0] = 1
    for r in ranks2:
        shifted = np.zeros_like(counts)
        shifted[r:] = counts[:-r]
        counts = counts + shifted
    total2 = int(ranks2.sum())  # 2 * (sum of ranks); the null mean of 2 W+ is total2 / 2
    observed = int(ranks2[d > 0].sum())
    dev = abs(2 * observed - total2)
    sums = np.arange(total2 + 1)
    extreme = np.abs(2 * sums - total2) >= dev
    return float(min(1.0, sum(counts[extreme]) / 2 ** d.size))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm step-down adjusted p-values, returned in the input order; a nan p (no test) stays nan
    and does not count among the m tests."""
    p = np.asarray(pvalues, dtype=np.float64)
    adjusted = np.full(p.size, math.nan)
    tested = np.flatnonzero(np.isfinite(p))
    m = tested.size
    order = tested[np.argsort(p[tested], kind="stable")]
    running = 0.0
    for rank, idx in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[idx]))
        adjusted[idx] = running
    return adjusted.tolist()


def non_finite_scores(results: dict) -> list[str]:
    """`<suite>: <key>=nan, ...` for each suite of a results.json whose summary holds a score that
    is not a finite number (a model that diverged, or overflowed in 16 bits)."""
    out = []
    for name, res in (results.get("suites") or {}).items():
        bad = [f"{k}={v}" for k, v in ((res or {}).get("summary") or {}).items()
               if isinstance(v, float) and not math.isfinite(v)]
        if bad:
            out.append(f"{name}: {', '.join(bad[:4])}" + (f" and {len(bad) - 4} more" if len(bad) > 4 else ""))
    return out


def paired_nll_by_length(nll_a: dict, nll_b: dict) -> dict:
    """Per length: wins for B (#(d_i > 0), d_i = NLL_A - NLL_B), the Wilcoxon p (and its method) and
    the Holm p across the lengths given (holm_m of them: lengths that ran out of memory are not).
    nll_a / nll_b: {length: [mean NLL per anchor]} over identical anchors."""
    lengths = list(nll_a)
    rows = {}
    for L in lengths:
        a, b = np.asarray(nll_a[L], dtype=np.float64), np.asarray(nll_b[L], dtype=np.float64)
        if a.shape != b.shape:
            raise ValueError(f"length {L}: {a.size} vs {b.size} anchors; pairs must match")
        d = a - b
        p, method = wilcoxon_signed_rank(d)
        rows[L] = {"n": int(d.size), "wins_b": int((d > 0).sum()), "losses_b": int((d < 0).sum()),
                   "mean_diff": float(d.mean()) if d.size else math.nan,
                   "p_wilcoxon": p, "wilcoxon_method": method}
    for L, p_holm in zip(lengths, holm([rows[L]["p_wilcoxon"] for L in lengths])):
        rows[L]["p_holm"] = p_holm
        rows[L]["holm_m"] = len(lengths)
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


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion k/n (z = 1.96: 95%); (nan, nan) for n = 0.
    Unlike the normal interval it stays inside [0, 1] and is not degenerate at k = 0 or k = n."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def scalar_stats(values: list[float]) -> dict:
    """mean, sample std (n - 1; None for one value), n, min, max."""
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None
    return {"mean": mean, "std": std, "n": n, "min": min(values), "max": max(values)}


# Figures.

def save_figure(fig, path: Path, rect: tuple | None = None) -> str:
    """Lay out (within `rect` of the figure, leaving the rest to e.g. a legend beside the axes) and save."""
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def annotated_heatmap(ax, grid: np.ndarray, max_cells: int = 400):
    """A [rows, cols] grid of rates in [0, 1] with each cell's value written in it (NaN: blank)."""
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    if grid.size <= max_cells:
        for i in range(grid.shape[0]):
            for j in range(grid.shape[1]):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8,
                            color="white" if grid[i, j] < 0.5 else "black")
    return im
