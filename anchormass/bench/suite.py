"""Run Standard and AnchorMass side by side in one process and collect every measurement.

Sections (each a list of rows {model, length, ...}), in this order:
- prefill: fresh cache + chunked prefill (`generate.prefill`), AnchorMass at `prefill_budget`
           (None: the model's default M_max); median of interleaved repeats.
- decode:  greedy decoding after a prefill, AnchorMass at `decode_budget` slots. A session left
           by the prefill section is reused when its budget matches (Standard always matches).
           ms/token = mean over a window of `block_size` tokens, so each window holds exactly one
           stage-1 compression and whatever stage 2 it triggers; median over windows, which are
           interleaved across all sessions.
- train:   forward + loss + backward (no optimizer update) on [batch, seq]; tokens/s.
- memory:  peak memory growth of a whole session (new cache + prefill + a few decode steps).
Warm-up runs before the first measurement of a section (one-time costs: lazy init, first
allocations); later lengths are not warmed again on CPU, which keeps the run within minutes
(`warmup_each` warms every length, for compiled kernels on CUDA).
Out-of-memory is recorded as a result ("OOM"), not a crash.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace

import torch

from anchormass.bench import measure, workloads
from anchormass.errors import ConfigError
from anchormass.models import build_model, load_model_config

K = 1024
SECTIONS = ("prefill", "decode", "train", "memory")


@dataclass
class BenchConfig:
    standard: str = "standard_mini"
    anchormass: str = "anchormass_mini"
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    chunk: int = 1024  # prefill chunk (docs/method.md §2.5 default)
    warmup: int = 1
    # Warm up before every length / shape, not only the first: needed where a new shape costs a
    # one-time compile (FlexAttention on CUDA); on CPU it would only double the long runs.
    warmup_each: bool = False
    repeats: int = 3
    prefill_lengths: list[int] = field(default_factory=lambda: [8 * K, 32 * K])
    prefill_budget: int | None = None  # AnchorMass slots in the prefill section; None = model default
    train_shapes: list[list[int]] = field(default_factory=lambda: [[4, 1 * K], [1, 4 * K]])  # [batch, seq]
    decode_lengths: list[int] = field(default_factory=lambda: [8 * K, 32 * K])
    decode_budget: int = 1024  # AnchorMass slot budget for decode and memory sessions
    decode_windows: int = 3  # measured windows of block_size tokens each (after one warm-up window)
    memory_lengths: list[int] = field(default_factory=lambda: [16 * K, 128 * K])
    memory_models: list[str] = field(default_factory=lambda: ["anchormass"])
    memory_decode_tokens: int = 8
    model_overrides: dict = field(default_factory=dict)  # ModelConfig fields applied to both presets

    def to_dict(self) -> dict:
        return asdict(self)


_LENGTHS_4K_256K = [4 * K * 2**i for i in range(7)]
PRESETS = {
    # The CPU benchmark: mini configs, the lengths the targets name.
    "cpu_mini": BenchConfig(),
    # GPU profile of the full models from 4K to 256K.
    "cuda_158m": BenchConfig(
        standard="standard_158m", anchormass="anchormass_158m", device="cuda", dtype="bfloat16",
        prefill_lengths=_LENGTHS_4K_256K, decode_lengths=_LENGTHS_4K_256K, memory_lengths=_LENGTHS_4K_256K,
        memory_models=["standard", "anchormass"], warmup_each=True,
    ),
    # Seconds-long smoke run of the harness (tests): tiny models shrunk further (one layer, small
    # vocabulary, 16-token blocks so a decode window is 16 tokens), short sequences.
    "toy": BenchConfig(
        standard="standard_tiny", anchormass="anchormass_tiny", chunk=128, warmup=1, repeats=2,
        prefill_lengths=[256, 512], train_shapes=[[2, 64], [1, 128]], decode_lengths=[256, 512],
        decode_budget=16, decode_windows=2, memory_lengths=[256, 512], memory_decode_tokens=2,
        model_overrides=dict(n_layers=1, vocab_size=512, window=16, block_size=16, group_size=4, n_sinks=4),
    ),
}


def preset(name: str, **overrides) -> BenchConfig:
    if name not in PRESETS:
        raise ConfigError(f"unknown bench preset '{name}'; presets: {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides)


def _is_oom(err: BaseException) -> bool:
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(err, RuntimeError) and "can't allocate memory" in str(err)


def _load_avg() -> list[float] | None:
    """1/5/15-minute load averages: how busy the machine was, to read wall-clock times by."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


class Bench:
    def __init__(self, cfg: BenchConfig, log=_log):
        self.cfg = cfg
        self.log = log
        self.device = torch.device(cfg.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device=cuda requested but CUDA is not available")
        dtype = getattr(torch, cfg.dtype, None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ConfigError(f"unknown or non-floating dtype '{cfg.dtype}' (use float32 / bfloat16 / float16)")
        unknown = sorted(set(cfg.memory_models) - {"standard", "anchormass"})
        if unknown:
            raise ConfigError(f"bench: memory_models must be 'standard' / 'anchormass', got {unknown}")
        torch.manual_seed(cfg.seed)
        self.models, self.configs = {}, {}
        for label, name in (("standard", cfg.standard), ("anchormass", cfg.anchormass)):
            mcfg = load_model_config(name)
            mcfg = mcfg.replace(**cfg.model_overrides) if cfg.model_overrides else mcfg
            if mcfg.arch != label:
                raise ConfigError(f"bench: '{name}' is arch '{mcfg.arch}', expected '{label}'")
            self.configs[label] = mcfg
            self.models[label] = build_model(mcfg).to(self.device, dtype).eval()
        self.vocab = self.configs["standard"].vocab_size
        # (label, length, budget) -> [cache, next token]: prefill sessions kept for the decode section.
        self._sessions: dict[tuple, list] = {}

    # ------------------------------------------------------------------ helpers
    def _ids(self, batch: int, length: int) -> torch.Tensor:
        return workloads.random_ids(self.vocab, batch, length, self.cfg.seed + length, self.device)

    @staticmethod
    def _budget(label: str, budget: int | None) -> int | None:
        return budget if label == "anchormass" else None

    def _row(self, section: str, label: str, **kw) -> dict:
        return {"section": section, "model": label, "name": getattr(self.cfg, label), **kw}

    def _free(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _guarded(self, rows: list[dict], fn) -> None:
        """Run fn() (which fills the rows); out-of-memory marks the rows 'OOM' instead of crashing."""
        try:
            fn()
            status = "ok"
        except (RuntimeError, MemoryError) as err:
            if not _is_oom(err):
                raise
            status = "OOM"
        self._free()
        for row in rows:
            row["status"] = status

    def _interleave(self, fns: dict, rows: dict, warmup: int, repeats: int, post) -> None:
        """Time `fns` interleaved; `post(key, timing)` gives a row's fields. A callable that runs
        out of memory leaves the rotation and only its own row becomes 'OOM'."""
        dead: set = set()

        def guarded(key, fn):
            def run():
                if key in dead:
                    return
                try:
                    fn()
                except (RuntimeError, MemoryError) as err:
                    if not _is_oom(err):
                        raise
                    dead.add(key)
                    self._free()
            return run

        timings = measure.time_interleaved({k: guarded(k, f) for k, f in fns.items()}, self.device, warmup, repeats)
        for key, t in timings.items():
            rows[key].update({"status": "OOM"} if key in dead else {**post(key, t), "status": "ok"})
        self._free()

    def _log_rows(self, rows, key: str, unit: str, spec: str) -> None:
        for r in rows:
            where = f"{r['batch']}x{r['length']}" if "batch" in r else f"{r['length']} tok"
            value = format(r[key], spec) if r["status"] == "ok" else r["status"]
            self.log(f"{r['section']:7s} {r['model']:10s} {where:>12s}: {value} {unit}")

    # ------------------------------------------------------------------ sections
    def run_prefill(self) -> list[dict]:
        """The time from a prompt to its first new token, both models, interleaved repeats."""
        out = []
        for i, length in enumerate(self.cfg.prefill_lengths):
            ids = self._ids(1, length)
            keep: dict[str, list] = {}
            budget = {label: self._budget(label, self.cfg.prefill_budget) for label in self.models}

            def session(label):
                def fn():
                    keep.pop(label, None)  # free the previous repeat's cache before building the next
                    keep[label] = list(workloads.prefill(self.models[label], ids, None, budget[label], self.cfg.chunk))
                return fn

            rows = {label: self._row("prefill", label, length=length, budget=budget[label]) for label in self.models}

            warmup = self.cfg.warmup if i == 0 or self.cfg.warmup_each else 0
            self._interleave({label: session(label) for label in self.models}, rows, warmup, self.cfg.repeats,
                             lambda label, t: {**t.to_dict(), "cache": workloads.cache_summary(keep[label][0])})
            for label, state in keep.items():  # kept only where the decode section can use it
                if length in self.cfg.decode_lengths and budget[label] == self._budget(label, self.cfg.decode_budget):
                    self._sessions[(label, length, budget[label])] = state
            self._log_rows(rows.values(), "median_s", "s", ".3f")
            out += rows.values()
        return out

    def _decode_session(self, label: str, ids: torch.Tensor, budget: int | None) -> list:
        state = self._sessions.pop((label, ids.shape[1], budget), None)
        if state is None:
            state = list(workloads.prefill(self.models[label], ids, None, budget, self.cfg.chunk))
        return state

    def run_decode(self) -> list[dict]:
        """All sessions (both models, every length) are built first, then their decode windows are
        interleaved, so both the model ratio and the 32K / 8K flatness compare windows measured
        under the same machine load. A session that does not fit is recorded as OOM."""
        window = self.configs["anchormass"].block_size
        rows, state = {}, {}
        for length in self.cfg.decode_lengths:
            ids = self._ids(1, length)
            for label in self.models:
                budget = self._budget(label, self.cfg.decode_budget)
                key = (label, length)
                rows[key] = self._row("decode", label, length=length, budget=budget, window_tokens=window)
                self._guarded([rows[key]], lambda key=key, ids=ids, budget=budget: state.__setitem__(
                    key, self._decode_session(key[0], ids, budget)))
        self._sessions.clear()

        def window_of(key):
            def fn():
                state[key][1] = workloads.decode(self.models[key[0]], *state[key], window)
            return fn

        self._interleave({key: window_of(key) for key in state}, rows, 1, self.cfg.decode_windows,
                         lambda key, t: {"ms_per_token": 1000.0 * t.median / window,
                                         "windows_ms_per_token": [1000.0 * s / window for s in t.times],
                                         "cpu_ms_per_token": 1000.0 * t.cpu_median / window,
                                         "cache": workloads.cache_summary(state[key][0])})
        state.clear()
        self._log_rows(rows.values(), "ms_per_token", "ms/token", ".2f")
        return list(rows.values())

    def run_train(self) -> list[dict]:
        out = []
        for model in self.models.values():
            model.train()
        for i, (batch, seq) in enumerate(self.cfg.train_shapes):
            ids = self._ids(batch, seq)
            steps = {label: (lambda m=m: workloads.train_step(m, ids)) for label, m in self.models.items()}
            rows = {label: self._row("train", label, batch=batch, length=seq) for label in self.models}

            warmup = self.cfg.warmup if i == 0 or self.cfg.warmup_each else 0
            self._interleave(steps, rows, warmup, self.cfg.repeats,
                             lambda label, t: {**t.to_dict(), "tokens_per_s": batch * seq / t.median,
                                               "cpu_tokens_per_s": batch * seq / t.cpu_median})
            self._log_rows(rows.values(), "tokens_per_s", "tok/s", ".0f")
            out += rows.values()
        for model in self.models.values():
            model.eval()
        return out

    def run_memory(self) -> list[dict]:
        """Peak memory of whole sessions. One short unmeasured session per model first, so one-time
        allocations (lazy initialisation, first buffers of a kind) are not charged to the first length."""
        out = []
        for label in self.cfg.memory_models:
            warm = self._ids(1, min(self.cfg.memory_lengths[0], 2 * self.cfg.chunk))
            self._guarded([], lambda label=label: workloads.decode(
                self.models[label], *workloads.prefill(self.models[label], warm, None,
                                                       self._budget(label, self.cfg.decode_budget), self.cfg.chunk),
                self.cfg.memory_decode_tokens))
        for length in self.cfg.memory_lengths:
            ids = self._ids(1, length)
            for label in self.cfg.memory_models:
                model = self.models[label]
                budget = self._budget(label, self.cfg.decode_budget)
                row = self._row("memory", label, length=length, budget=budget,
                                method=measure.memory_method(self.device))

                def session(model=model, budget=budget, row=row):
                    cache, token = workloads.prefill(model, ids, None, budget, self.cfg.chunk)
                    workloads.decode(model, cache, token, self.cfg.memory_decode_tokens)
                    row["cache"] = workloads.cache_summary(cache)

                def fill(session=session, row=row):
                    t0 = time.perf_counter()
                    row["peak_bytes"] = measure.peak_memory_growth(session, self.device)
                    row["seconds"] = time.perf_counter() - t0

                self._guarded([row], fill)
                self._log_rows([row], "peak_bytes", "bytes peak growth", ",")
                out.append(row)
        return out

    def run(self, skip=()) -> dict:
        t0, c0 = time.perf_counter(), time.process_time()
        result = {
            "load_avg_start": _load_avg(),
            "config": self.cfg.to_dict(),
            "device": str(self.device),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "memory_method": measure.memory_method(self.device),
            "models": {label: c.to_dict() for label, c in self.configs.items()},
        }
        for section in SECTIONS:
            result[section] = [] if section in skip else getattr(self, f"run_{section}")()
        result["elapsed_s"] = time.perf_counter() - t0
        result["cpu_elapsed_s"] = time.process_time() - c0
        result["load_avg_end"] = _load_avg()
        return result
