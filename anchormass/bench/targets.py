"""The issue-7 targets as data, and the ratios computed from one run's measured rows.

A ratio is computed only from numbers measured in the same run; a target whose inputs are
missing (not measured, OOM) is reported as 'n/a', never filled in.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable

K = 1024
OPS = {"<=": operator.le, ">=": operator.ge}


def _find(result: dict, section: str, model: str, length: int, **kw) -> dict | None:
    for row in result.get(section, []):
        if (row["model"] == model and row["length"] == length and row.get("status") == "ok"
                and all(row.get(k) == v for k, v in kw.items())):
            return row
    return None


def _field(result, section, model, length, key, **kw):
    row = _find(result, section, model, length, **kw)
    return None if row is None else row.get(key)


def _div(a, b):
    return None if a is None or b is None or b == 0 else a / b


# A time-based ratio is read on the wall clock (the verdict) or on process CPU time.
CPU_KEYS = {"median_s": "cpu_median_s", "tokens_per_s": "cpu_tokens_per_s", "ms_per_token": "cpu_ms_per_token"}


def _ratio(section: str, key: str, num: tuple, den: tuple, **kw):
    """(result, clock) -> row[num][key] / row[den][key]; num, den = (model, length)."""
    def compute(result: dict, clock: str = "wall"):
        k = CPU_KEYS[key] if clock == "cpu" else key
        return _div(_field(result, section, *num, k, **kw), _field(result, section, *den, k, **kw))
    return compute


def prefill_ratio(length):
    return _ratio("prefill", "median_s", ("anchormass", length), ("standard", length))


def train_ratio(batch, seq):
    return _ratio("train", "tokens_per_s", ("anchormass", seq), ("standard", seq), batch=batch)


def decode_flatness(short, long):
    return _ratio("decode", "ms_per_token", ("anchormass", long), ("anchormass", short))


def decode_speedup(length):
    return _ratio("decode", "ms_per_token", ("standard", length), ("anchormass", length))


def memory_ratio(short, long):
    return _ratio("memory", "peak_bytes", ("anchormass", long), ("anchormass", short))


def past_budget_lengths(result: dict) -> list[int]:
    """Lengths at which even a cache with no outlier slots (one slot per group) holds more than
    the decode budget: there the AnchorMass cache must have hit the budget."""
    cfg = result["models"]["anchormass"]
    budget = result["config"]["decode_budget"]
    lengths = sorted({row["length"] for row in cache_rows(result, "anchormass") if row["budget"] == budget})
    per_block = cfg["block_size"] // cfg["group_size"]
    return [n for n in lengths if (n - cfg["n_sinks"]) // cfg["block_size"] * per_block > budget]


def cache_rows(result: dict, model: str) -> list[dict]:
    """Every measured cache of one model: (length, budget, nbytes) from all sections."""
    rows = []
    for section in ("prefill", "decode", "memory"):
        for row in result.get(section, []):
            if row["model"] == model and row.get("status") == "ok" and "cache" in row:
                rows.append({"section": section, "model": model, "length": row["length"], "budget": row["budget"],
                             "tokens": row["cache"]["tokens"], "nbytes": row["cache"]["nbytes"]})
    return rows


def cache_constancy(result: dict, clock: str = "wall"):
    """max / min of AnchorMass cache bytes over the budget-limited sessions past the budget,
    each measured at the end of its session (1.0 = constant)."""
    budget = result["config"]["decode_budget"]
    lengths = past_budget_lengths(result)
    sizes = [row["nbytes"] for row in cache_rows(result, "anchormass")
             if row["budget"] == budget and row["length"] in lengths]
    if len(set(lengths)) < 2:
        return None
    return max(sizes) / min(sizes)


@dataclass(frozen=True)
class Target:
    key: str
    what: str
    op: str
    bound: float
    compute: Callable[..., float | None]  # (result, clock) -> ratio or None
    timed: bool = True  # a time ratio: also read on CPU time


def issue_targets(short: int = 8 * K, long: int = 32 * K, train=((4, 1 * K), (1, 4 * K)),
                  memory=(16 * K, 128 * K)) -> list[Target]:
    """The issue's targets; the defaults are the issue's lengths (tests pass toy lengths)."""
    (b1, s1), (b2, s2) = train
    m1, m2 = memory
    return [
        Target("prefill_short", f"prefill time AnchorMass / Standard at {_k(short)}", "<=", 1.5,
               prefill_ratio(short)),
        Target("prefill_long", f"prefill time AnchorMass / Standard at {_k(long)}", "<=", 1.0, prefill_ratio(long)),
        Target("train_short", f"train tokens/s AnchorMass / Standard at {_k(s1)} (batch {b1})", ">=", 0.8,
               train_ratio(b1, s1)),
        Target("train_long", f"train tokens/s AnchorMass / Standard at {_k(s2)} (batch {b2})", ">=", 0.8,
               train_ratio(b2, s2)),
        Target("decode_flat", f"AnchorMass decode ms/token {_k(long)} / {_k(short)} (budget-limited)", "<=", 1.10,
               decode_flatness(short, long)),
        Target("decode_speedup", f"decode ms/token Standard / AnchorMass at {_k(long)}", ">=", 2.0,
               decode_speedup(long)),
        Target("cache_constant", "AnchorMass cache bytes max / min past the budget", "<=", 1.0, cache_constancy,
               timed=False),
        Target("memory_ratio", f"AnchorMass session peak memory {_k(m2)} / {_k(m1)}", "<=", 1.1,
               memory_ratio(m1, m2), timed=False),
    ]


def _k(n: int) -> str:
    return f"{n // K}K" if n % K == 0 else str(n)


def evaluate(result: dict, targets: list[Target] | None = None) -> list[dict]:
    """One row per target: measured ratio (wall clock; CPU time beside it), bound, PASS / MISS / n/a.
    The verdict is on the wall clock, as the issue defines the targets."""
    rows = []
    for t in targets if targets is not None else issue_targets():
        value = t.compute(result, "wall")
        status = "n/a" if value is None else ("PASS" if OPS[t.op](value, t.bound) else "MISS")
        rows.append({"key": t.key, "what": t.what, "target": f"{t.op} {t.bound:g}", "measured": value,
                     "measured_cpu_time": t.compute(result, "cpu") if t.timed else None, "timed": t.timed,
                     "status": status})
    return rows
