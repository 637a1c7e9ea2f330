"""Aggregation of one comparison's per-seed results.json over training seeds."""

import json
import math
import statistics
import subprocess
import sys

import pytest

from anchormass.errors import ConfigError, DataError
from anchormass.eval import registry
from anchormass.eval.aggregate import aggregate, main, write_aggregate
from anchormass.eval.suite import Suite

from _train_helpers import subprocess_env


def result(ppl: dict, passkey: dict | None = None) -> dict:
    suites = {"ppl": {"summary": ppl, "items": []}}
    if passkey is not None:
        suites["passkey"] = passkey
    return {"suite": ["ppl", "passkey"], "suites": suites}


def test_generic_aggregation_is_mean_sample_std_n_min_max():
    values = [3.0, 5.0, 10.0]
    per_seed = [result({"a/ctx0/ppl": v, "b/ctx0/ppl": 2 * v, "flag": True, "note": "x"}) for v in values]
    per_seed[1]["suites"]["ppl"]["summary"]["a/ctx0/ppl"] = float("nan")  # a failed cell: left out, n says so
    agg = aggregate(per_seed, [0, 1, 2])
    stats = agg["suites"]["ppl"]["json"]["summary"]
    assert set(stats) == {"a/ctx0/ppl", "b/ctx0/ppl"}  # booleans and text are not scalars
    b = stats["b/ctx0/ppl"]
    assert b["mean"] == pytest.approx(36 / 3) and b["std"] == pytest.approx(statistics.stdev([6.0, 10.0, 20.0]))
    assert (b["n"], b["min"], b["max"]) == (3, 6.0, 20.0)
    a = stats["a/ctx0/ppl"]
    assert (a["n"], a["mean"], a["per_seed"]) == (2, 6.5, {"0": 3.0, "2": 10.0})
    assert a["std"] == pytest.approx(math.sqrt(((3 - 6.5) ** 2 + (10 - 6.5) ** 2) / 1))
    md = agg["suites"]["ppl"]["markdown"]
    assert "| b/ctx0/ppl | 12 ± 7.211 | 3 | 6 | 20 |" in md


def test_one_seed_has_no_std_and_suites_missing_somewhere_are_listed():
    agg = aggregate([result({"x": 1.0}, {"skipped": "no tokenizer"})], [4])
    assert agg["suites"]["ppl"]["json"]["summary"]["x"]["std"] is None
    assert "| x | 1 ± - | 1 |" in agg["suites"]["ppl"]["markdown"]
    assert agg["missing"] == {"passkey": "not run for seed(s) 4"} and "passkey" not in agg["suites"]


def test_bad_inputs(tmp_path):
    with pytest.raises(ConfigError, match="2 results for 1 seeds"):
        aggregate([result({}), result({})], [0])
    with pytest.raises(ConfigError, match="distinct"):
        aggregate([result({}), result({})], [1, 1])
    with pytest.raises(DataError, match="no results file"):
        write_aggregate([tmp_path / "nope.json"], [0], tmp_path / "out")


class HookSuite(Suite):
    name = "hooked"

    @classmethod
    def aggregate(cls, per_seed_results, seeds):
        total = sum(r["summary"]["hits"] for r in per_seed_results)

        def plots(out_dir):
            (out_dir / "hooked.png").write_bytes(b"png")
            return ["hooked.png"]

        return {"markdown": f"## hooked\n\n{total} hits over seeds {seeds}\n", "plots": plots, "json": {"hits": total}}


def test_a_suites_own_aggregate_is_used_and_written(tmp_path, monkeypatch):
    monkeypatch.setitem(registry.SUITES, "hooked", f"{__name__}:HookSuite")
    paths = []
    for seed, hits in ((0, 2), (1, 5)):
        d = tmp_path / "report" / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "report.md").write_text("per seed")
        (d / "results.json").write_text(json.dumps({"suites": {"hooked": {"summary": {"hits": hits}},
                                                               "ppl": {"summary": {"p": float(hits)}}}}))
        paths.append(d / "results.json")
    out = write_aggregate(paths, [0, 1], tmp_path / "report", note="x vs y")
    report = (out / "report.md").read_text()
    assert "\n- x vs y\n" in report
    assert "7 hits over seeds [0, 1]" in report and "![hooked.png](hooked.png)" in report
    assert "[seed0/report.md](seed0/report.md)" in report and "| p | 3.5 ± 2.121 | 2 |" in report
    data = json.loads((out / "results.json").read_text())
    assert data["suites"]["hooked"] == {"json": {"hits": 7}, "plots": ["hooked.png"]}
    assert data["seeds"] == [0, 1] and (out / "hooked.png").read_bytes() == b"png"


@pytest.mark.parametrize("args, message", [
    (["out_dir=x", "seeds=[0]"], "error: aggregate: missing inputs"),
    (["out_dir=x", "inputs=[a.json]", "seeds=[zero]"], "error: aggregate: seeds must be integers"),
    (["bogus"], "error: aggregate: expected out_dir="),
])
def test_cli_errors_are_one_line_with_exit_2(capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith(message) and len(err.strip().splitlines()) == 1, err


def test_cli_entry_point(tmp_path):
    """python -m anchormass.eval.aggregate: a missing input is one line and exit 2; good inputs write the report."""
    cmd = [sys.executable, "-m", "anchormass.eval.aggregate", f"out_dir={tmp_path / 'agg'}"]
    proc = subprocess.run([*cmd, "inputs=[missing.json]", "seeds=[0]"], cwd=tmp_path, env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == "error: aggregate: no results file missing.json\n", proc.stderr
    (tmp_path / "r.json").write_text(json.dumps(result({"x": 2.0})))
    proc = subprocess.run([*cmd, f"inputs=[{tmp_path / 'r.json'}]", "seeds=[0]"], cwd=tmp_path, env=subprocess_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "| x | 2 ± - | 1 |" in (tmp_path / "agg" / "report.md").read_text(), proc.stderr
