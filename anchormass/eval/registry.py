"""Suites by name: the one list of suites. Modules are imported when a suite is asked for, so a
suite with heavy dependencies costs nothing to a run that does not use it; `suite=all` runs the
suites whose class sets `in_all`, in this order. Importing this module imports no torch, so
`evaluate.py --help` lists the suites at once."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from anchormass.errors import ConfigError

if TYPE_CHECKING:
    from anchormass.eval.suite import Suite

# name -> "module:Class"
SUITES: dict[str, str] = {
    "profile": "anchormass.eval.suites.profile:ProfileSuite",
    "ppl": "anchormass.eval.suites.ppl:PplSuite",
    "passkey": "anchormass.eval.suites.passkey:PasskeySuite",
    "policies": "anchormass.eval.suites.policies:PoliciesSuite",
    "jcqa": "anchormass.eval.suites.jcqa:JcqaSuite",
    "hitrate": "anchormass.eval.suites.hitrate:HitRateSuite",
    "baselines": "anchormass.eval.suites.baselines:BaselinesSuite",
    "lm_eval": "anchormass.eval.suites.lm_eval:LmEvalSuite",
    "recall_frontier": "anchormass.eval.suites.frontier:RecallFrontierSuite",
    "mqar": "anchormass.eval.suites.mqar:MqarSuite",
    "retrofit": "anchormass.eval.suites.retrofit:RetrofitSuite",
    "kv_frontier": "anchormass.eval.suites.kv_frontier:KvFrontierSuite",
}


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
