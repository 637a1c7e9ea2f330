"""PNGs of suite=retrofit: the recall-compression frontier, recall at g8 against the number of
global heads, and the answer-token validation loss of each cell's chain of stages."""

from __future__ import annotations

from pathlib import Path

from anchormass.eval.report import plt, save_figure

G8_HEADS_158M = 14 * 6  # the write-up's model: 14 layers x 6 global heads of 64


def _log_x(ax) -> None:
    """A log x-axis labelled in plain numbers (matplotlib's minor 3x10^3 labels run into each other)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _ci(x: dict) -> tuple[float, float]:
    return x["acc"] - x["ci"][0], x["ci"][1] - x["acc"]


def frontier_plot(cells: dict, shown: list[int], path: Path) -> str:
    """Passkey exact against stored KV bytes per sequence, one line per shape through its cells tagged
    `frontier` (the Standard and the group sizes with the write-up's other constants), one panel per
    length shown."""
    fig, axes = plt.subplots(1, len(shown), figsize=(5.2 * len(shown), 4), squeeze=False)
    shapes = list(dict.fromkeys(c["info"]["shape"] for c in cells.values()))
    for ax, L in zip(axes[0], shown):
        for shape in shapes:
            line = sorted(((c["bytes"], c["by_length"][L], lab, c["info"]) for lab, c in cells.items()
                           if c["info"]["shape"] == shape and c["bytes"] is not None
                           and "frontier" in c["info"]["tags"]), key=lambda t: t[0])
            if not line:
                continue
            xs = [t[0] / 1024 for t in line]
            ys = [t[1]["acc"] for t in line]
            err = list(zip(*[_ci(t[1]) for t in line]))
            bars = ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=shape)
            for x, y, t in zip(xs, ys, line):
                name = "Std" if t[3]["arch"] == "standard" else f"g{t[3]['group_size']}"
                ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7,
                            color=bars[0].get_color())
        _log_x(ax)
        ax.set_ylim(-0.03, 1.05)
        ax.axhline(0.8, color="grey", lw=0.5, ls="--")
        ax.set_xlabel("stored KV KiB per sequence (measured)")
        ax.set_ylabel("passkey exact")
        ax.set_title(f"{L:,} tokens")
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def heads_plot(cells: dict, shown: list[int], path: Path) -> str:
    """Passkey exact of each shape's cell tagged `g8` (the write-up's constants) against its number of global
    heads (layers x global heads per layer); the 158M model's 84 marked for the GPU check."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    # by heads, then label: two shapes may have as many global heads (tiny_h8 and l4g2: 8)
    g8 = sorted(((lab, c) for lab, c in cells.items() if "g8" in c["info"]["tags"]),
                key=lambda item: (item[1]["info"]["global_heads_total"], item[0]))
    for L in shown:
        pts = [(c["info"]["global_heads_total"], c["by_length"][L], lab) for lab, c in g8]
        if pts:
            ax.errorbar([p[0] for p in pts], [p[1]["acc"] for p in pts], yerr=list(zip(*[_ci(p[1]) for p in pts])),
                        marker="o", capsize=3, label=f"{L:,} tokens")
            for x, r, lab in pts:
                ax.annotate(lab, (x, r["acc"]), textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.axvline(G8_HEADS_158M, color="grey", lw=0.5, ls=":")
    ax.annotate("158M model", (G8_HEADS_158M, 0.5), fontsize=7, rotation=90)
    _log_x(ax)
    ax.set_ylim(-0.03, 1.05)
    ax.set_xlabel("global heads (layers x global heads per layer)")
    ax.set_ylabel("passkey exact at g8")
    if ax.get_legend_handles_labels()[0]:  # no g8 cell scored: an empty frame, not a legend warning
        ax.legend(fontsize=7)
    return save_figure(fig, path)


def curves_plot(cells: dict, path: Path) -> str:
    """Answer-token validation loss against steps over each cell's long-context stages (the mean
    over its seeds at each step), one panel per shape."""
    shapes = list(dict.fromkeys(c["info"]["shape"] for c in cells.values()))
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for lab, c in cells.items():
            if c["info"]["shape"] != shape:
                continue
            by_step: dict[int, list[float]] = {}
            for curve in c["curves"]:
                stages = list(dict.fromkeys(p["stage"] for p in curve))[-3:]  # the long-context stages
                first = min((p["step"] for p in curve if p["stage"] in stages), default=0)
                for p in curve:
                    if p["stage"] in stages:
                        by_step.setdefault(p["step"] - first, []).append(p["val_loss"])
            if by_step:
                steps = sorted(by_step)
                ax.plot(steps, [sum(by_step[s]) / len(by_step[s]) for s in steps], marker=".", ms=3, label=lab)
        ax.set_title(shape)
        ax.set_xlabel("step within the long-context stages")
        ax.set_ylabel("answer-token validation loss")
        ax.set_yscale("log")
        ax.legend(fontsize=6)
    return save_figure(fig, path)
