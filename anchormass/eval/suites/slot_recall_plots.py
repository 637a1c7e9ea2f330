"""PNGs of suite=slot_recall: recall per model (and shape) per task, and held-out learning curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from anchormass.eval.plots import plt, save_figure


def recall_by_model(labels, cells, path: Path, shapes: dict | None = None) -> str:
    """One panel per task: accuracy with its 95% interval per model (grouped by shape when given)."""
    tasks = [c for c in cells]
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 4), squeeze=False)
    for ax, c in zip(axes[0], tasks):
        acc = np.array([c[lab]["acc"] for lab in labels])
        lo = acc - np.array([c[lab]["ci"][0] for lab in labels])
        hi = np.array([c[lab]["ci"][1] for lab in labels]) - acc
        ax.bar(range(len(labels)), acc, yerr=[lo, hi], capsize=3, color="tab:blue")
        names = [f"{lab}\n{shapes[lab]}" if shapes else lab for lab in labels]
        ax.set_xticks(range(len(labels)), names, rotation=60, ha="right", fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_title(f"{c['task']} ({c['length'] - 1} tokens)")
        ax.set_ylabel("held-out exact accuracy")
    return save_figure(fig, path)


def _curve_axes(keys):
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 3.8), squeeze=False)
    return fig, dict(zip(keys, axes[0]))


def learning_curves(curves: dict, path: Path) -> str:
    """One seed: accuracy against checkpoint step, one panel per task, a line per model."""
    keys = sorted({k for pts in curves.values() for p in pts for k in p["cells"]})
    fig, axes = _curve_axes(keys)
    for lab, pts in curves.items():
        for k, ax in axes.items():
            xy = [(p["step"], p["cells"][k]["acc"]) for p in pts if k in p["cells"]]
            if xy:
                ax.plot(*zip(*xy), marker="o", ms=3, label=lab)
    for k, ax in axes.items():
        ax.set_title(k.split("/")[0])
        ax.set_xlabel("step")
        ax.set_ylim(0, 1.05)
    next(iter(axes.values())).legend(fontsize=7)
    return save_figure(fig, path)


def pooled_curves(labels, cells, path: Path) -> str:
    """Over seeds: the mean held-out accuracy against checkpoint step, one panel per task."""
    fig, axes = _curve_axes([f"{c['task']}/{c['length']}" for c in cells])
    for c in cells:
        ax = axes[f"{c['task']}/{c['length']}"]
        for lab in labels:
            if c[lab]["curve"]:
                ax.plot(*zip(*c[lab]["curve"]), marker="o", ms=3, label=lab)
        ax.axhline(0.8, color="grey", lw=0.5, ls="--")
        ax.set_title(c["task"])
        ax.set_xlabel("step")
        ax.set_ylim(0, 1.05)
    next(iter(axes.values())).legend(fontsize=7)
    return save_figure(fig, path)
