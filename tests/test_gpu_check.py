"""scripts/gpu_check.sh: the dry run on CPU exercises every item and the failure-continues path;
recorded CUDA-test rows, the time budget and SIGTERM are handled without measuring anything."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from anchormass.bench import gpu_check

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_dry_run_prints_every_row_and_continues_past_a_failure(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([str(REPO / "scripts" / "gpu_check.sh"), "dry_run=true", "inject_failure=decode",
                           f"out={tmp_path}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]  # the injected failure makes the run fail, at the end
    assert "decode FAILED: RuntimeError: failure injected" in proc.stderr
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    sections = [r[0] for r in rows]
    for section in ("tests", "flex vs SDPA", "prefill", "peak memory", "train", "ratio"):
        assert section in sections, section
    assert ["decode", "-", "FAILED", "RuntimeError: failure injected by inject_failure="] in rows
    assert sections.index("decode") < sections.index("peak memory")  # the items after the failure still ran
    assert all(r[2] == "PASS" for r in rows if r[0] == "flex vs SDPA")
    ratio_rows = {r[1]: r for r in rows if r[0] == "ratio"}
    assert len(ratio_rows) == 8  # the two decode ratios have no inputs; the others are computed
    assert [what for what, r in ratio_rows.items() if r[2] == "n/a"] == [
        "AnchorMass decode ms/token 256 / 128 (budget-limited)", "decode ms/token Standard / AnchorMass at 256"]
    assert (tmp_path / "table.md").read_text() in proc.stdout


def test_recorded_rows_are_reported_without_measuring(monkeypatch):
    run = gpu_check.Run(gpu_check.FULL, budget_s=1e9, log=lambda *a, **k: None)
    run.records = [
        {"arch": "anchormass", "length": 4096, "dtype": "bfloat16", "bound": 0.0156, "out": 0.01, "out_rel": 0.004,
         "dq": 0.5, "dq_rel": 0.1, "dk": 0.01, "dk_rel": 0.001, "dv": 0.01, "dv_rel": 0.001},
        {"check": "train", "model": "standard", "batch": 16, "length": 1024, "loss": 10.3, "step_s": 0.1,
         "tokens_per_s": 163840.0, "mfu": 0.3, "peak_bytes": 2**33, "compile_s": 40.0},
        {"check": "parallel_vs_incremental", "model": "anchormass_158m", "length": 333, "chunk": 64,
         "max_diff": 3e-5},
    ]
    monkeypatch.setattr(gpu_check.Run, "_cfg", lambda *a: pytest.fail("measured instead of reading the record"))
    run.sizes = gpu_check.Sizes(**{**gpu_check.FULL.__dict__, "train_shapes": [(16, 1024)]})
    monkeypatch.setattr("anchormass.bench.gpu_probes.train_steps",
                        lambda *a, **k: pytest.fail("measured instead of reading the record"), raising=True)
    run.kernels()
    with pytest.raises(pytest.fail.Exception):  # anchormass 16x1K was not recorded: it would be measured
        run.train()
    rows = {(r[0], r[1]): r for r in run.rows}
    assert rows[("flex vs SDPA", "anchormass bfloat16 T=4096")][2] == "MISS"  # dq 0.1 rel > bound
    assert rows[("train", "standard 16x1024")][2] == "163,840 tok/s"
    assert "MFU 30.0%" in rows[("train", "standard 16x1024")][3]
    assert rows[("equivalence", "anchormass_158m T=333 chunk 64")][2] == "3.0e-05"


def test_spent_budget_skips_items_and_sigterm_stops_the_run():
    run = gpu_check.Run(gpu_check.DRY, budget_s=-1, log=lambda *a, **k: None)
    run.run()
    assert [r[2] for r in run.rows] == ["SKIPPED"] * 7
    run = gpu_check.Run(gpu_check.DRY, budget_s=1e9, log=lambda *a, **k: None)

    def killed():
        raise gpu_check.TimeUp()

    assert run.item("prefill", killed) is False
    assert run.rows == [["prefill", "-", "STOPPED", "terminated (time limit) while running"]]


def test_no_cuda_is_one_line_error():
    if gpu_check.torch.cuda.is_available():
        pytest.skip("CUDA present")
    proc = subprocess.run([sys.executable, "-m", "anchormass.bench.gpu_check"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "no CUDA device" in proc.stderr


def test_options_are_key_value_and_an_unknown_one_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "anchormass.bench.gpu_check", "dry_rn=true"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: unknown key dry_rn")
    assert proc.stderr.count("\n") == 1
