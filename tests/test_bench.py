"""Smoke test of the benchmark harness at toy sizes: it runs both models, writes JSON / Markdown /
PNG, and every ratio it reports is the ratio of the numbers it measured. No speed assertions."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from anchormass.bench import measure, report, suite, targets

ROOT = Path(__file__).resolve().parents[1]
SHORT, LONG = 256, 512
TOY = dict(short=SHORT, long=LONG, train=((2, 64), (1, 128)), memory=(SHORT, LONG))


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared CI machine: one thread avoids oversubscription stalls
    try:
        result = suite.Bench(suite.preset("toy"), log=lambda msg: None).run()
    finally:
        torch.set_num_threads(threads)
    rows = targets.evaluate(result, targets.issue_targets(**TOY))
    paths = report.write_all(result, rows, tmp_path_factory.mktemp("bench"))
    return result, rows, paths


def _one(result, section, model, length, **kw):
    (row,) = [r for r in result[section] if r["model"] == model and r["length"] == length
              and all(r[k] == v for k, v in kw.items())]
    assert row["status"] == "ok"
    return row


def test_every_section_measures_both_models(toy_run):
    result, _, _ = toy_run
    for section, lengths in (("prefill", [SHORT, LONG]), ("decode", [SHORT, LONG])):
        for model in ("standard", "anchormass"):
            for n in lengths:
                row = _one(result, section, model, n)
                assert row["cache"]["tokens"] >= n
                assert row["cache"]["nbytes"] > 0
    assert all(len(r["times_s"]) == 2 and r["median_s"] > 0 for r in result["prefill"])
    assert all(r["tokens_per_s"] > 0 and r["cpu_tokens_per_s"] > 0 for r in result["train"])
    assert all(len(r["cpu_times_s"]) == 2 for r in result["prefill"] + result["train"])
    assert all(len(r["windows_ms_per_token"]) == 2 for r in result["decode"])
    assert [r["length"] for r in result["memory"]] == [SHORT, LONG]
    # The budget-limited AnchorMass cache never holds more slots than the budget (16).
    for n in (SHORT, LONG):
        slots = _one(result, "decode", "anchormass", n)["cache"]["slots"]
        assert max(max(s) if isinstance(s, list) else s for s in slots) <= 16


def test_ratios_are_the_measured_ratios(toy_run):
    result, rows, _ = toy_run
    by_key = {r["key"]: r for r in rows}
    assert set(by_key) == {"prefill_short", "prefill_long", "train_short", "train_long", "decode_flat",
                           "decode_speedup", "cache_constant", "memory_ratio"}
    expect = {
        "prefill_long": _one(result, "prefill", "anchormass", LONG)["median_s"]
        / _one(result, "prefill", "standard", LONG)["median_s"],
        "train_short": _one(result, "train", "anchormass", 64, batch=2)["tokens_per_s"]
        / _one(result, "train", "standard", 64, batch=2)["tokens_per_s"],
        "decode_flat": _one(result, "decode", "anchormass", LONG)["ms_per_token"]
        / _one(result, "decode", "anchormass", SHORT)["ms_per_token"],
        "decode_speedup": _one(result, "decode", "standard", LONG)["ms_per_token"]
        / _one(result, "decode", "anchormass", LONG)["ms_per_token"],
    }
    # Toy sessions may stay below the RSS resolution (peak 0): then the ratio must be n/a, not a number.
    short_peak = _one(result, "memory", "anchormass", SHORT)["peak_bytes"]
    if short_peak > 0:
        expect["memory_ratio"] = _one(result, "memory", "anchormass", LONG)["peak_bytes"] / short_peak
    else:
        assert by_key["memory_ratio"]["measured"] is None
    for key, value in expect.items():
        assert math.isclose(by_key[key]["measured"], value, rel_tol=1e-12), key
        assert by_key[key]["status"] in ("PASS", "MISS")
    # The same ratio read on CPU time comes from the CPU-time fields of the same rows.
    cpu = (_one(result, "decode", "standard", LONG)["cpu_ms_per_token"]
           / _one(result, "decode", "anchormass", LONG)["cpu_ms_per_token"])
    assert math.isclose(by_key["decode_speedup"]["measured_cpu_time"], cpu, rel_tol=1e-12)
    assert by_key["cache_constant"]["measured_cpu_time"] is None
    # A bound is applied as written: flip the measured value around the bound and the verdict flips.
    t = targets.Target("x", "x", "<=", 1.0, lambda r, clock: 2.0)
    assert targets.evaluate(result, [t])[0]["status"] == "MISS"
    t = targets.Target("x", "x", ">=", 1.0, lambda r, clock: 2.0)
    assert targets.evaluate(result, [t])[0]["status"] == "PASS"


def test_missing_measurements_are_not_filled_in(toy_run):
    result, _, _ = toy_run
    # The issue's lengths (8K / 32K ...) were not measured in the toy run: every length-bound target
    # is n/a (cache constancy is judged on whatever lengths are past the budget).
    assert {r["status"] for r in targets.evaluate(result) if r["key"] != "cache_constant"} == {"n/a"}
    oom = dict(result, prefill=[dict(r, status="OOM") for r in result["prefill"]])
    rows = {r["key"]: r for r in targets.evaluate(oom, targets.issue_targets(**TOY))}
    assert rows["prefill_long"]["status"] == "n/a" and rows["prefill_long"]["measured"] is None


def test_outputs_written(toy_run):
    result, rows, paths = toy_run
    data = json.loads(paths["json"].read_text())
    assert data["memory_method"] == measure.CPU_MEMORY_METHOD
    assert [r["key"] for r in data["targets"]] == [r["key"] for r in rows]
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = paths["markdown"].read_text()
    assert "## Targets" in text and "peak RSS growth" in text
    assert not list(paths["json"].parent.glob("*.tmp"))  # atomic writes leave nothing behind


def test_peak_memory_sees_a_large_temporary():
    """The CPU method must register memory that is allocated and freed inside the call."""
    size = 64 * 2**20

    def work():
        x = torch.ones(size // 4)  # 64 MiB of float32, freed on return
        return float(x[0])

    assert measure.peak_memory_growth(work, "cpu") >= 0.9 * size
    assert measure.peak_memory_growth(lambda: None, "cpu") < 0.5 * size


PEAK_AFTER_EARLIER_WORK = """
import torch
from anchormass.bench import measure
x = torch.ones(2**24); del x                      # raises glibc's dynamic mmap threshold
y = [torch.ones(2**20) for _ in range(64)]; del y  # 256 MiB freed into the heap, still resident
def session():
    z = [torch.ones(2**20) for _ in range(16)]     # 64 MiB in 4 MiB tensors
    return len(z)
print(measure.peak_memory_growth(session, "cpu"))
"""


def test_peak_memory_not_hidden_by_memory_freed_earlier():
    """A fresh process with a heap full of freed pages (what the earlier bench sections leave)."""
    proc = subprocess.run([sys.executable, "-c", PEAK_AFTER_EARLIER_WORK], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.strip()) >= 0.9 * 64 * 2**20


def _load_cli():
    spec = importlib.util.spec_from_file_location("bench_cli", ROOT / "scripts" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench_config(overrides: list[str]):
    """configs/bench.yaml with command-line overrides, composed as scripts/bench.py's Hydra main does."""
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return compose("bench", overrides=overrides)


@pytest.mark.parametrize("overrides", [["preset=nope"], ["preset=toy", "skip=[lunch]"], ["preset=toy", "repeats=0"],
                                       ["preset=toy", "repeats=two"], ["preset=toy", "standard=anchormass_tiny"],
                                       ["preset=toy", "train_shapes=[4y1K]"], ["prefill_lengths=[-8K]"],
                                       ["prefill_lengths=[8Q]"], ["preset=toy", "threads=-1"],
                                       ["preset=toy", "dtype=int8"], ["preset=toy", "device=tpu"],
                                       ["preset=toy", f"out={__file__}"]])
def test_cli_rejects_bad_input_with_one_line(overrides, capsys):
    with pytest.raises(SystemExit) as exc:
        _load_cli().main(_bench_config(overrides))  # Hydra passes a given config straight through
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_cli_parses_lengths_and_shapes():
    from anchormass.bench import run as cli

    assert cli.lengths("prefill_lengths", ["8K", 32768]) == [8192, 32768]
    assert cli.lengths("prefill_lengths", "2K") == [2048]
    assert cli.shapes("train_shapes", ["4x1K", "1X4096"]) == [[4, 1024], [1, 4096]]


def test_cli_exits_2_as_a_process():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "preset=nope"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: unknown bench preset"), proc.stderr


def test_out_of_memory_is_a_result_for_that_model_only(monkeypatch):
    """A Standard session that does not fit becomes 'OOM'; AnchorMass at the same length still runs."""
    real_prefill = suite.workloads.prefill

    def prefill(model, ids, policy, budget, chunk):
        if model.cfg.arch == "standard" and ids.shape[1] == LONG:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_prefill(model, ids, policy, budget, chunk)

    monkeypatch.setattr(suite.workloads, "prefill", prefill)
    cfg = suite.preset("toy", repeats=1, decode_windows=1, memory_models=["standard", "anchormass"])
    result = suite.Bench(cfg, log=lambda msg: None).run(skip=("train",))
    status = {(r["section"], r["model"], r["length"]): r["status"]
              for section in ("prefill", "decode", "memory") for r in result[section]}
    for section in ("prefill", "decode", "memory"):
        assert status[(section, "standard", LONG)] == "OOM"
        assert status[(section, "anchormass", LONG)] == "ok"
        assert status[(section, "standard", SHORT)] == "ok"
    rows = {r["key"]: r for r in targets.evaluate(result, targets.issue_targets(**TOY))}
    assert rows["prefill_long"]["status"] == rows["decode_speedup"]["status"] == "n/a"
    assert "OOM" in report.render(result, list(rows.values()))


def test_busy_machine_is_flagged(toy_run):
    result, rows, _ = toy_run
    cpus = os.cpu_count() or 1
    busy = dict(result, load_avg_start=[4.0 * cpus, 1, 1], load_avg_end=[4.0 * cpus, 1, 1])
    idle = dict(result, load_avg_start=[0.0, 0, 0], load_avg_end=[0.1, 0, 0])
    assert "NOTE: load average" in report.render(busy, rows)
    assert "NOTE: load average" not in report.render(idle, rows)
