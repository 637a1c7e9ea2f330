"""Cell texts of the slot-recall tables, shared by the per-run report (slot_recall.py) and the
pooled one over seeds (slot_recall_pool.py)."""

from __future__ import annotations

import numpy as np

from anchormass.eval.slot_probe import STATUSES


def mean_present(xs) -> float | None:
    """Mean of the values that are not None (None when there are none)."""
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def status_text(layers: list[dict]) -> str:
    """Answer copies over the global layers: outlier / anchor / averaged (exact, raw when present)."""
    if not layers:
        return "-"
    mean = {s: float(np.mean([lay["status"].get(s, 0.0) for lay in layers])) for s in STATUSES}
    return " / ".join(f"{100 * mean[s]:.0f}" for s in ("outlier", "anchor", "averaged")) + "".join(
        f" ({s} {100 * mean[s]:.0f})" for s in ("exact", "raw") if mean[s])


def fmt_share(x, pct=True) -> str:
    return "-" if x is None else (f"{100 * x:.1f}%" if pct else f"{x:.3f}")
