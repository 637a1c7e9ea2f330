"""The GPU acceptance run behind scripts/gpu_check.sh: the CUDA tests, then one table.

    python -m anchormass.bench.gpu_check                 # one H100/H200, <= 8 minutes
    python -m anchormass.bench.gpu_check dry_run=true    # CPU, tiny models: the run's own logic

Options (key=value, like every entry point): dry_run=true, budget_s=<s> (start no new item after
this; default 450, dry 900), out=<dir> (table.md and rows.json; default outputs/gpu_check),
inject_failure=<item> (make the named item fail: tests the reporting).

Items, in order (each one that fails prints what and why, and the run goes on to the next):
  tests    pytest -m cuda; the kernel comparisons and training steps they record become rows
  kernels  flex vs block-wise SDPA max differences not recorded by the tests
  prefill, decode, memory   both models from 4K to 256K, AnchorMass at the 8,192-slot budget
  train    tokens/s, MFU and peak memory of both models' compiled bf16-mixed training steps
  ratios   the benchmark targets (anchormass/bench/targets.py) from this run's rows
A time budget stops starting new items once spent; SIGTERM prints the table gathered so far.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import hydra
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from anchormass.bench import targets
from anchormass.bench.report import markdown_table
from anchormass.cli import check_overrides, exit_on_error
from anchormass.errors import ConfigError
from anchormass.utils import CHECKOUT, CONFIG_ROOT, atomic_write_json, atomic_write_text, resolve_path

K = 1024
GiB, MiB = 2**30, 2**20


@dataclass
class Sizes:
    standard: str
    anchormass: str
    device: str
    compiled: bool
    kernel_lengths: list[int]
    kernel_grads: bool
    train_shapes: list[tuple[int, int]]  # (batch, seq)
    serve_lengths: list[int]
    decode_budget: int
    dtype: str
    peak_tflops: float | None
    target_lengths: dict  # keyword arguments of targets.issue_targets
    model_overrides: dict = field(default_factory=dict)
    test_timeout_s: int = 270
    test_paths: tuple[str, ...] = ("tests",)


FULL = Sizes(
    standard="standard_158m", anchormass="anchormass_158m", device="cuda", compiled=True,
    kernel_lengths=[1000, 4096, 32768], kernel_grads=True,
    train_shapes=[(16, 1 * K), (4, 4 * K), (1, 32 * K)],
    serve_lengths=[4 * K * 2**i for i in range(7)], decode_budget=8192, dtype="bfloat16", peak_tflops=989.0,
    target_lengths=dict(short=8 * K, long=32 * K, train=((16, 1 * K), (4, 4 * K)), memory=(16 * K, 128 * K)),
)
# CPU, seconds: one-layer tiny models with 16-token blocks, eager FlexAttention (forward only).
DRY = Sizes(
    standard="standard_tiny", anchormass="anchormass_tiny", device="cpu", compiled=False,
    kernel_lengths=[40, 64], kernel_grads=False, train_shapes=[(2, 64), (1, 128)],
    serve_lengths=[128, 256], decode_budget=16, dtype="float32", peak_tflops=None,
    target_lengths=dict(short=128, long=256, train=((2, 64), (1, 128)), memory=(128, 256)),
    model_overrides=dict(n_layers=1, vocab_size=512, window=16, block_size=16, group_size=4, n_sinks=4),
    test_timeout_s=120, test_paths=("tests/test_cuda_kernels.py", "tests/test_cuda_training.py"),
)


class TimeUp(Exception):
    pass


class Run:
    """Items run in order; each adds table rows [section, item, result, detail]."""

    def __init__(self, sizes: Sizes, budget_s: float, inject_failure: str | None = None, log=print):
        self.sizes, self.budget_s, self.inject = sizes, budget_s, inject_failure
        self.log = log
        self.t0 = time.perf_counter()
        self.rows: list[list[str]] = []
        self.records: list[dict] = []  # what the CUDA tests recorded
        self.bench_result: dict = {}
        self.train_rows: list[dict] = []

    # ---------------------------------------------------------------- plumbing
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def add(self, section: str, item: str, result: str, detail: str = "") -> None:
        self.rows.append([section, item, result, detail])

    def item(self, name: str, fn) -> bool:
        """Run one item; a failure becomes a row (and a line now) and the run goes on. False: stop."""
        if self.elapsed() > self.budget_s:
            self.add(name, "-", "SKIPPED", f"time budget of {self.budget_s:.0f} s spent")
            return True
        start = time.perf_counter()
        try:
            if self.inject == name:
                raise RuntimeError("failure injected by inject_failure=")
            fn()
        except TimeUp:
            self.add(name, "-", "STOPPED", "terminated (time limit) while running")
            return False
        except Exception as err:  # noqa: BLE001 - the run reports every failure and continues
            what = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
            self.log(f"[gpu_check] {name} FAILED: {what}", file=sys.stderr, flush=True)
            self.add(name, "-", "FAILED", what[:200])
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        self.log(f"[gpu_check] {name} done in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        return True

    def _cfg(self, label: str):
        from anchormass.models import load_model_config

        cfg = load_model_config(getattr(self.sizes, label))
        return cfg.replace(**self.sizes.model_overrides) if self.sizes.model_overrides else cfg

    # ---------------------------------------------------------------- items
    def tests(self) -> None:
        """The CUDA tests; their recorded measurements are read back for the table."""
        with tempfile.TemporaryDirectory() as tmp:
            record = Path(tmp) / "record.jsonl"
            env = {**os.environ, "ANCHORMASS_GPU_RECORD": str(record)}
            cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *self.sizes.test_paths]
            try:
                proc = subprocess.run(cmd, cwd=CHECKOUT,  # the checkout's tests
                                      env=env, capture_output=True, text=True,
                                      timeout=self.sizes.test_timeout_s)
                summary = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
                failed = proc.returncode not in (0, 5)  # 5: nothing collected
            except subprocess.TimeoutExpired:
                summary, failed = f"timed out after {self.sizes.test_timeout_s} s", True
                proc = None
            if record.exists():
                self.records = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
        self.add("tests", "pytest -m cuda", "FAILED" if failed else "ok", summary)
        if failed and proc is not None:
            for line in proc.stdout.splitlines():
                if line.startswith(("FAILED", "ERROR")):
                    self.add("tests", "failed test", "FAILED", line[:200])

    def kernels(self) -> None:
        from anchormass.bench.gpu_probes import flex_vs_sdpa, within_bound

        recorded = [r for r in self.records if "arch" in r]
        rows = list(recorded)
        if not recorded:  # the tests did not run them (CPU, or a failure): measure here
            warnings.filterwarnings("ignore", message=".*flex_attention.*")  # eager flex warns once per call
            for arch in ("anchormass", "standard"):
                cfg = self._cfg(arch)
                for dtype in (torch.float32, torch.bfloat16):
                    for t in self.sizes.kernel_lengths:
                        rows.append(flex_vs_sdpa(cfg, arch, t, dtype, self.sizes.device,
                                                 grads=self.sizes.kernel_grads, compiled=self.sizes.compiled))
        for r in rows:
            diffs = " ".join(f"{k} {r[k]:.1e}" + (f" ({r[k + '_rel']:.1e} rel)" if r["dtype"] != "float32" else "")
                             for k in ("out", "dq", "dk", "dv") if k in r)
            verdict = "PASS" if within_bound(r) else "MISS"
            self.add("flex vs SDPA", f"{r['arch']} {r['dtype']} T={r['length']}", verdict,
                     f"max |diff|: {diffs}; bound {r['bound']:.1e}" + ("" if "dq" in r else "; forward only"))
        for r in self.records:
            if r.get("check") == "parallel_vs_incremental":
                self.add("equivalence", f"{r['model']} T={r['length']} chunk {r['chunk']}",
                         f"{r['max_diff']:.1e}", "parallel vs prefill + decode, fp32, CUDA")

    def train(self) -> None:
        from anchormass.bench.gpu_probes import train_steps

        done = {(r["model"], r["batch"], r["length"]): r for r in self.records if r.get("check") == "train"}
        for batch, seq in self.sizes.train_shapes:
            for label in ("standard", "anchormass"):
                r = done.get((label, batch, seq))
                if r is None:
                    if self.elapsed() > self.budget_s:
                        self.add("train", f"{label} {batch}x{seq}", "SKIPPED", "time budget spent")
                        continue
                    try:
                        m = train_steps(self._cfg(label), batch, seq, self.sizes.device, compiled=self.sizes.compiled,
                                        bf16=True, steps=2, peak_tflops=self.sizes.peak_tflops)
                    except Exception as err:  # noqa: BLE001 - one shape failing (e.g. OOM) keeps the others
                        self.add("train", f"{label} {batch}x{seq}", "FAILED", f"{type(err).__name__}: {err}"[:200])
                        torch.cuda.empty_cache() if torch.cuda.is_available() else None
                        continue
                    r = {"model": label, "batch": batch, "length": seq, **m.__dict__}
                mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
                peak = "n/a" if r["peak_bytes"] is None else f"{r['peak_bytes'] / GiB:.1f} GiB"
                self.add("train", f"{label} {batch}x{seq}", f"{r['tokens_per_s']:,.0f} tok/s",
                         f"MFU {mfu}, peak {peak}, loss {r['loss']:.2f}, first step {r['compile_s']:.0f} s"
                         + (" (compile)" if self.sizes.compiled else ""))
                self.train_rows.append({"section": "train", "model": label, "batch": batch, "length": seq,
                                        "status": "ok", "tokens_per_s": r["tokens_per_s"]})

    def _bench(self):
        if not hasattr(self, "_bench_obj"):
            from anchormass.bench.suite import Bench, BenchConfig

            s = self.sizes
            cfg = BenchConfig(standard=s.standard, anchormass=s.anchormass, device=s.device, dtype=s.dtype,
                              warmup=1, repeats=1, prefill_lengths=s.serve_lengths, prefill_budget=s.decode_budget,
                              decode_lengths=s.serve_lengths, decode_budget=s.decode_budget, decode_windows=2,
                              memory_lengths=s.serve_lengths, memory_models=["standard", "anchormass"],
                              memory_decode_tokens=4, train_shapes=[], model_overrides=s.model_overrides)
            self._bench_obj = Bench(cfg, log=lambda msg: None)
            self.bench_result = {"models": {k: c.to_dict() for k, c in self._bench_obj.configs.items()},
                                 "config": cfg.to_dict()}
        return self._bench_obj

    def serve(self, section: str) -> None:
        rows = getattr(self._bench(), f"run_{section}")()
        self.bench_result[section] = rows
        for r in rows:
            name = f"{r['model']} {r['length'] // K}K" if r["length"] % K == 0 else f"{r['model']} {r['length']}"
            if r.get("status") != "ok":
                self.add(section, name, r.get("status", "?"), "")
                continue
            kv = f"KV {r['cache']['nbytes'] / MiB:,.1f} MiB" if "cache" in r else ""
            if section == "prefill":
                self.add(section, name, f"{r['median_s']:.3f} s", kv)
            elif section == "decode":
                self.add(section, name, f"{1000.0 / r['ms_per_token']:,.1f} tok/s", kv)
            else:
                self.add("peak memory", name, f"{r['peak_bytes'] / MiB:,.1f} MiB", kv + " (prefill + decode session)")

    def ratios(self) -> None:
        result = {**self.bench_result, "train": self.train_rows}
        if "models" not in result:
            raise RuntimeError("no prefill/decode/memory measurements to compute ratios from")
        for row in targets.evaluate(result, targets.issue_targets(**self.sizes.target_lengths)):
            value = "n/a" if row["measured"] is None else f"{row['measured']:.3f}"
            self.add("ratio", row["what"], row["status"], f"{value} (target {row['target']})")

    def run(self) -> None:
        # Training last: the CUDA tests record the short shapes, so only the longest is left to
        # compile here, and a slow compile cannot crowd out the serving measurements.
        items = [("tests", self.tests), ("kernels", self.kernels), ("prefill", lambda: self.serve("prefill")),
                 ("decode", lambda: self.serve("decode")), ("memory", lambda: self.serve("memory")),
                 ("train", self.train), ("ratios", self.ratios)]
        for name, fn in items:
            if not self.item(name, fn):
                break

    def table(self) -> str:
        head = (f"GPU check on {torch.cuda.get_device_name(0) if self.sizes.device == 'cuda' else 'cpu (dry run)'}, "
                f"torch {torch.__version__}, {self.elapsed():.0f} s")
        return "\n".join([head, "", *markdown_table(["section", "item", "result", "detail"], self.rows)]) + "\n"


# The options' defaults; no run folder, no log file (as scripts/merge_data.py).
ConfigStore.instance().store(name="gpu_check", node={
    "dry_run": False, "budget_s": None, "out": None, "inject_failure": None,
    "defaults": [{"override hydra/job_logging": "none"}, {"override hydra/hydra_logging": "none"}, "_self_"],
    "hydra": {"output_subdir": None, "run": {"dir": "."}},
})


def run_check(args: DictConfig) -> int:
    """The whole run with the given options; the exit status (1 when an item failed, was skipped or stopped)."""
    sizes = DRY if args.dry_run else FULL
    if sizes.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("gpu_check: no CUDA device; use dry_run=true on a CPU machine")
    run = Run(sizes, float(args.budget_s) if args.budget_s is not None else (900.0 if args.dry_run else 450.0),
              args.inject_failure)

    def stop(signum, frame):
        raise TimeUp()

    signal.signal(signal.SIGTERM, stop)
    try:
        run.run()
    except TimeUp:
        run.add("run", "-", "STOPPED", "terminated (time limit)")
    text = run.table()
    print(text, flush=True)
    out = Path(args.out) if args.out else resolve_path("outputs/gpu_check")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "table.md", text)
    atomic_write_json(out / "rows.json", {"rows": run.rows, "records": run.records})
    return 1 if any(r[2] in ("FAILED", "STOPPED", "SKIPPED") for r in run.rows) else 0


@hydra.main(version_base="1.3", config_path=None, config_name="gpu_check")
def main(args: DictConfig) -> None:
    sys.exit(exit_on_error(run_check)(args))


if __name__ == "__main__":
    check_overrides(CONFIG_ROOT, "gpu_check", sys.argv[1:])  # an unknown option: one line, exit 2
    main()
