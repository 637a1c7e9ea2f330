"""Suites by name. Modules are imported when a suite is asked for, so a suite with heavy
dependencies costs nothing to a run that does not use it."""

from __future__ import annotations

import importlib

from anchormass.errors import ConfigError
from anchormass.eval.suite import Suite

# name -> "module:Class"
SUITES: dict[str, str] = {
    "profile": "anchormass.eval.profile:ProfileSuite",
    "ppl": "anchormass.eval.ppl:PplSuite",
    "passkey": "anchormass.eval.passkey:PasskeySuite",
    "policies": "anchormass.eval.policies:PoliciesSuite",
    "jcqa": "anchormass.eval.jcqa:JcqaSuite",
    "hitrate": "anchormass.eval.hitrate:HitRateSuite",
    "baselines": "anchormass.eval.baselines:BaselinesSuite",
    "lm_eval": "anchormass.eval.lm_eval_suite:LmEvalSuite",
    "recall_frontier": "anchormass.eval.frontier:RecallFrontierSuite",
    "mqar": "anchormass.eval.mqar:MqarSuite",
    "slot_recall": "anchormass.eval.slot_recall:SlotRecallSuite",
}


def suite_names() -> list[str]:
    return list(SUITES)


def suite_class(name: str) -> type[Suite]:
    if name not in SUITES:
        raise ConfigError(f"unknown suite '{name}'; choose one of {', '.join(SUITES)} or 'all'")
    module, cls = SUITES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_suite(name: str, cfg: dict | None = None) -> Suite:
    return suite_class(name)(cfg)
