"""Markdown tables for the reports (the write-up's layout: one row per length / cell)."""

from __future__ import annotations

from typing import Sequence

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
