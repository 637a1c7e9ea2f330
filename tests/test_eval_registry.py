import pytest

from anchormass.errors import ConfigError
from anchormass.eval import registry
from anchormass.eval.runner import run_evaluation, suite_list
from anchormass.eval.suite import Suite


def test_every_registered_suite_imports_and_implements_the_interface():
    assert set(registry.SUITES) >= {"profile", "ppl", "passkey", "policies", "jcqa", "hitrate", "baselines"}
    for name in registry.SUITES:
        suite = registry.make_suite(name, {})
        assert isinstance(suite, Suite) and suite.name == name


def test_unknown_suite_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown suite 'nope'"):
        registry.make_suite("nope")
    with pytest.raises(ConfigError, match="unknown suite"):
        suite_list({"suite": "ppl,nope"})
    assert suite_list({"suite": "all", "all_suites": ["ppl", "jcqa"]}) == (["ppl", "jcqa"], True)


def test_suite_all_is_the_registry_s_in_all_suites_in_registry_order():
    # the list suite=all ran before the registry's in_all flags replaced runner.DEFAULT_ALL
    assert registry.all_suites() == ["profile", "ppl", "passkey", "policies", "jcqa", "hitrate", "baselines"]
    assert suite_list({"suite": "all"}) == (registry.all_suites(), True)
    assert suite_list({"suite": "all", "all_suites": None}) == (registry.all_suites(), True)


def test_policies_asked_for_by_name_on_a_standard_model_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="needs an AnchorMass model"):
        run_evaluation({"suite": "policies", "model": "standard_tiny", "out_dir": str(tmp_path / "o")})
    assert not (tmp_path / "o").exists()


def test_suite_all_skips_what_does_not_apply_with_a_reason(tmp_path):
    out = run_evaluation({"suite": "all", "all_suites": ["policies", "jcqa", "ppl"], "model": "standard_tiny",
                          "out_dir": str(tmp_path / "o"), "progress": False})
    report = (out / "report.md").read_text()
    for name in ("policies", "jcqa", "ppl"):
        assert f"suite `{name}` skipped" in report


def test_git_state_is_taken_when_the_run_starts(tmp_path, monkeypatch):
    """A long run must record the code it loaded, not the tree as it is when the run ends."""
    import json

    import anchormass.eval.runner as runner

    states = iter([{"commit": "a" * 40, "dirty": False, "modified": 0, "untracked_source": []},
                   {"commit": "b" * 40, "dirty": True, "modified": 3, "untracked_source": []}])
    monkeypatch.setattr(runner, "git_state", lambda: next(states))
    out = run_evaluation({"suite": "all", "all_suites": ["policies"], "model": "standard_tiny",
                          "out_dir": str(tmp_path / "o"), "progress": False})
    res = json.loads((out / "results.json").read_text())
    assert res["git"]["commit"] == "a" * 40 and res["git_commit"] == "a" * 40
