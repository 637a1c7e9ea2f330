"""Scoring a generated passkey answer (docs/method.md §6 c): NFKC, first digit run, exact / digits matched."""

from __future__ import annotations

import re
import unicodedata

_DIGITS = re.compile(r"[0-9]+")


def first_digit_run(text: str) -> str | None:
    """NFKC first (full-width ４２ -> 42), then the first run of ASCII digits, if any."""
    match = _DIGITS.search(unicodedata.normalize("NFKC", text))
    return match.group(0) if match else None


def score_answer(text: str, key: str) -> dict:
    """exact: the first digit run equals the key; digits: position-wise matches of its first
    len(key) digits with the key (0..4 for a 4-digit key)."""
    run = first_digit_run(text)
    if run is None:
        return {"answer": None, "exact": False, "digits": 0}
    digits = sum(a == b for a, b in zip(run[: len(key)], key))
    return {"answer": run, "exact": run == key, "digits": int(digits)}
