"""Typed checks on user-written configuration, shared by the entry points."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from anchormass.errors import ConfigError


def _select(cfg: Any, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = node.get(part) if node is not None else None
    return node


@dataclass(frozen=True)
class Number:
    """A numeric setting: `whole` ones refuse 20.7 (int() would silently make it 20), and an
    optional lower bound refuses values that can only fail later (0 steps between validations
    divides by zero, a negative step count ends in Lightning's traceback)."""

    whole: bool = False
    minimum: float | None = None
    above: bool = False  # True: the minimum itself is refused (lr > 0)

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` ("must be ..."), or None when it is acceptable."""
        kind = "must be a whole number" if self.whole else "must be a number"
        try:
            number = float(value)  # "fast", [1, 2] raise here
        except (TypeError, ValueError):
            return kind
        if isinstance(value, bool) or not math.isfinite(number) or (self.whole and number != int(number)):
            return kind
        if self.minimum is not None and (number < self.minimum or (self.above and number == self.minimum)):
            bound = int(self.minimum) if self.minimum == int(self.minimum) else self.minimum
            return f"must be {'>' if self.above else '>='} {bound}"
        return None

    def __call__(self, value: Any) -> int | float:
        if self.problem(value):
            raise ValueError(value)
        return int(float(value)) if self.whole else float(value)


WHOLE = Number(whole=True)
COUNT = Number(whole=True, minimum=1)        # steps, batch sizes, lengths
NON_NEGATIVE_WHOLE = Number(whole=True, minimum=0)
POSITIVE = Number(minimum=0, above=True)     # learning rates
NON_NEGATIVE = Number(minimum=0)


def check_numbers(cfg: Any, fields: Mapping[str, Callable[[Any], Any]], label: str = "",
                  message: str = "must be a number") -> None:
    """Each dotted key of `fields` that `cfg` sets must convert with its type (`int`, `float` or
    a `Number`); a value that does not (a word, a list, 20.7 for a whole number, 0 for a count)
    is a one-line ConfigError naming `label + key`, so later `int(...)` / `float(...)` calls
    cannot end in a traceback or silently change the value."""
    for key, kind in fields.items():
        value = _select(cfg, key)
        if value is None:
            continue
        if isinstance(kind, Number):
            problem = kind.problem(value)
        else:
            try:
                kind(value)
                problem = None
            except (TypeError, ValueError):
                problem = message
        if problem:
            raise ConfigError(f"{label}{key} {problem}, got {value!r}") from None


def check_required(cfg: Any, label: str = "") -> None:
    """A `???` (OmegaConf's mandatory value) left unset is a one-line ConfigError naming the key,
    not a later "file not found: .../???"."""
    from omegaconf import OmegaConf

    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        key = f"{label}{missing[0]}"
        raise ConfigError(f"{key} is required and not set; pass {key}=<value>")
