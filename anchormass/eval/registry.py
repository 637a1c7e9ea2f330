"""Suites by name. Modules are imported lazily so a suite whose file has not landed (or whose
dependencies are heavy) costs nothing until it is asked for."""

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
}


def suite_names() -> list[str]:
    return list(SUITES)


def suite_class(name: str) -> type[Suite]:
    if name not in SUITES:
        raise ConfigError(f"unknown suite '{name}'; choose one of {', '.join(SUITES)} or 'all'")
    module, cls = SUITES[name].split(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name == module:
            raise ConfigError(f"suite '{name}' is not available ({module} is missing)") from err
        raise
    return getattr(mod, cls)


def is_available(name: str) -> bool:
    try:
        suite_class(name)
    except ConfigError:
        return False
    return True


def make_suite(name: str, cfg: dict | None = None) -> Suite:
    return suite_class(name)(cfg)
