"""The suites by name (registry.py imports them when asked for); kept apart from the registry
so that `evaluate.py --help` lists them without importing torch."""

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
}
