"""Typed checks on user-written configuration, shared by the entry points."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from anchormass.errors import ConfigError


def _select(cfg: Any, dotted: str) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = node.get(part) if node is not None else None
    return node


def check_numbers(cfg: Any, fields: Mapping[str, Callable[[Any], Any]], label: str = "",
                  message: str = "must be a number") -> None:
    """Each dotted key of `fields` that `cfg` sets must convert with its type (`int`, `float`);
    a value that does not (a word, a list) is a one-line ConfigError naming `label + key`, so
    later `int(...)` / `float(...)` calls cannot end in a traceback."""
    for key, kind in fields.items():
        value = _select(cfg, key)
        if value is None:
            continue
        try:
            kind(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{label}{key} {message}, got {value!r}") from None
