"""Suites by name: the one list of suites. Modules are imported when a suite is asked for, so a
suite with heavy dependencies costs nothing to a run that does not use it; `suite=all` runs the
suites whose class sets `in_all`, in this order."""

from __future__ import annotations

import importlib

from anchormass.errors import ConfigError
from anchormass.eval.suite import Suite
from anchormass.eval.suite_names import SUITES


def suite_class(name: str) -> type[Suite]:
    if name not in SUITES:
        raise ConfigError(f"unknown suite '{name}'; choose one of {', '.join(SUITES)} or 'all'")
    module, cls = SUITES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_suite(name: str, cfg: dict | None = None) -> Suite:
    return suite_class(name)(cfg)


def all_suites() -> list[str]:
    """The suites `suite=all` runs: those whose class sets `in_all`, in registry order."""
    return [name for name in SUITES if suite_class(name).in_all]
