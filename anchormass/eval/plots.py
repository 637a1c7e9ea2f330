"""PNG plots for the reports (matplotlib, Agg backend: no display needed).

Each function takes a suite's result dict, writes one PNG and returns its file name. Files go
into the runner's staging folder, which is renamed into place only when the whole run succeeded.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)
import numpy as np  # noqa: E402

MIB = 1024 ** 2


def save_figure(fig, path: Path) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def _num(v):
    return float(v) if isinstance(v, (int, float)) else np.nan  # "OOM" / None -> gap in the line


def profile(result: dict, path: Path) -> str:
    """KV bytes / peak memory / prefill time / decode tok/s vs length, every model on one chart."""
    panels = [("kv_bytes", "KV cache (MiB)", MIB), ("peak_bytes", "peak memory growth (MiB)", MIB),
              ("prefill_s", "prefill time, median (s)", 1), ("decode_tok_s", "decode (tok/s)", 1)]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4))
    series: dict[str, list[dict]] = {}
    for row in result["rows"]:
        series.setdefault(row["series"], []).append(row)
    for ax, (key, title, scale) in zip(axes, panels):
        for name, rows in series.items():
            xs = [r["length"] for r in rows]
            ys = [_num(r.get(key)) / scale for r in rows]
            ax.plot(xs, ys, marker="o", label=name)
            for x, r in zip(xs, rows):
                if r.get("status") not in (None, "ok"):
                    ax.annotate(r["status"], (x, 0), textcoords="offset points", xytext=(0, 4), fontsize=7)
        ax.set_xscale("log", base=2)
        ax.set_ylim(bottom=0)  # sizes and rates: the zero line makes growth readable
        ax.set_xlabel("context length (tokens)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return save_figure(fig, path)


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


def passkey_heatmap(result: dict, path: Path) -> str:
    """Exact-match rate by length (rows) x needle depth (columns), one panel per model."""
    labels, lengths, depths = result["labels"], result["lengths"], result["depths"]
    fig, axes = plt.subplots(1, len(labels), figsize=(1.2 * len(depths) * len(labels) + 2, 0.5 * len(lengths) + 2),
                             squeeze=False)
    for ax, lab in zip(axes[0], labels):
        im = annotated_heatmap(ax, np.array(result["heatmap"][lab], dtype=float))  # [lengths, depths]
        ax.set_xticks(range(len(depths)), [f"{d:.0%}" for d in depths])
        ax.set_yticks(range(len(lengths)), [f"{L:,}" for L in lengths])
        ax.set_xlabel("needle depth")
        ax.set_ylabel("length (tokens)")
        ax.set_title(f"passkey exact match: {lab}")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def policy_bars(result: dict, path: Path) -> str:
    """Exact-match rate per stage-2 policy (bars) at each budget (groups), one panel per model."""
    labels, policies, budgets = result["labels"], result["policies"], result["budgets"]
    fig, axes = plt.subplots(1, len(labels), figsize=(2.2 * len(budgets) * len(labels) + 2, 4), squeeze=False)
    width = 0.8 / len(policies)
    for ax, lab in zip(axes[0], labels):
        cells = {(c["policy"], c["budget"]): c for c in result["cells"] if c["model"] == lab}
        for k, pol in enumerate(policies):
            rates = [cells[(pol, b)]["hits"] / max(1, cells[(pol, b)]["n"]) if (pol, b) in cells else np.nan
                     for b in budgets]
            ax.bar(np.arange(len(budgets)) + k * width, rates, width, label=pol)
        ax.set_xticks(np.arange(len(budgets)) + 0.4 - width / 2, [f"{b} slots" for b in budgets])
        ax.set_ylim(0, 1)
        ax.set_ylabel("passkey exact match")
        ax.set_title(f"stage-2 policies at {result['length']:,} tokens: {lab}")
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize=8)
    return save_figure(fig, path)


def ppl_vs_context(result: dict, path: Path) -> str:
    """PPL per model vs total length; with two models, B's win count is written at each point."""
    labels = result["labels"]
    xs = [r["length"] for r in result["rows"]]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for lab in labels:
        ax.plot(xs, [np.nan if r[lab] == "OOM" else r[lab]["ppl"] for r in result["rows"]], marker="o", label=lab)
    if len(labels) == 2:
        for r in result["rows"]:
            t = r.get("test")
            if t is not None and r[labels[1]] != "OOM":
                ax.annotate(f"{t['wins_b']}/{t['n']}", (r["length"], r[labels[1]]["ppl"]),
                            textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
        ax.set_title(f"PPL vs context (numbers: {labels[1]} wins per length)")
    else:
        ax.set_title("PPL vs context")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("input length (tokens)")
    ax.set_ylabel("perplexity of the last targets")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def mqar_accuracy(result: dict, path: Path) -> str:
    """MQAR accuracy vs length (log2 x), one line per (model, number of pairs)."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for lab in result["labels"]:
        for pairs in result["n_pairs"]:
            cells = sorted((c for c in result["cells"] if c["n_pairs"] == pairs), key=lambda c: c["length"])
            ax.plot([c["length"] for c in cells], [c[lab]["acc"] for c in cells], marker="o",
                    label=f"{lab}, {pairs} pairs")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1)
    ax.set_xlabel("item length (tokens)")
    ax.set_ylabel("query accuracy")
    ax.set_title(f"MQAR ({result['mode']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
