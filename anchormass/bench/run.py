"""`python scripts/bench.py` as a library call: the command's options (configs/bench.yaml) checked
and read ("8K" lengths, "4x1K" shapes, sections to skip), the preset run with them, the report
printed and written (report.py)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, ListConfig

from anchormass.bench.suite import SECTIONS
from anchormass.config_checks import check_numbers
from anchormass.errors import ConfigError

# Options given to the preset as they are (lengths and shapes are parsed first).
TEXT = ("standard", "anchormass", "dtype", "device")
WHOLE = ("repeats", "warmup", "decode_windows", "decode_budget", "chunk", "seed")


def _items(key: str, value) -> list:
    """A list option as given on the command line: [8K,32K], or one value."""
    items = list(value) if isinstance(value, (list, tuple, ListConfig)) else [value]
    if not items:
        raise ConfigError(f"{key}: give one or more values, e.g. {key}=[8K,32K]")
    return items


def _length(key: str, item) -> int:
    """8K or 8192 -> 8192."""
    text = str(item).strip().upper()
    try:
        n = int(text[:-1]) * 1024 if text.endswith("K") else int(text)
    except ValueError:
        raise ConfigError(f"{key}: bad length '{item}' (use e.g. 8K or 8192)") from None
    if n <= 0:
        raise ConfigError(f"{key}: lengths must be positive, got {item}")
    return n


def lengths(key: str, value) -> list[int]:
    return [_length(key, item) for item in _items(key, value)]


def shapes(key: str, value) -> list[list[int]]:
    """[4x1K,1x4K] -> [[4, 1024], [1, 4096]] (batch x sequence length)."""
    out = []
    for item in _items(key, value):
        batch, x, seq = str(item).strip().upper().partition("X")
        if not x or not batch.isdigit() or int(batch) <= 0:
            raise ConfigError(f"{key}: bad shape '{item}' (use e.g. 4x1K)")
        out.append([int(batch), _length(key, seq)])
    return out


def run_bench(cfg: DictConfig) -> int:
    """The benchmark configs/bench.yaml describes: checks the options, runs the preset with them,
    prints the report and writes bench.md / bench.json / bench.png into `out`."""
    check_numbers(cfg, dict.fromkeys((*WHOLE, "threads"), int), message="must be a whole number")
    if cfg.device not in (None, "cpu", "cuda"):
        raise ConfigError(f"device must be cpu or cuda, got {cfg.device!r}")
    skip = [str(s) for s in _items("skip", cfg.skip)] if cfg.skip not in (None, []) else []
    unknown = sorted(set(skip) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"skip: unknown section(s) {unknown}; sections are {', '.join(SECTIONS)}")
    for key in ("repeats", "decode_windows", "chunk", "decode_budget", "threads"):
        if cfg[key] is not None and int(cfg[key]) < 1:
            raise ConfigError(f"{key} must be >= 1, got {cfg[key]}")
    overrides = {k: str(cfg[k]) for k in TEXT if cfg[k] is not None}
    overrides.update({k: int(cfg[k]) for k in WHOLE if cfg[k] is not None})
    overrides.update({k: lengths(k, cfg[k]) for k in ("prefill_lengths", "decode_lengths", "memory_lengths")
                      if cfg[k] is not None})
    if cfg.train_shapes is not None:
        overrides["train_shapes"] = shapes("train_shapes", cfg.train_shapes)
    name = cfg.preset or ("cuda_158m" if cfg.device == "cuda" else "cpu_mini")
    out_dir = Path(cfg.out or Path("outputs") / "bench" / name)

    import torch

    from anchormass.bench import report, suite, targets

    bench_cfg = suite.preset(name, **overrides)
    if cfg.threads is not None:
        torch.set_num_threads(int(cfg.threads))
    try:  # before the run: a bad out must not cost a whole benchmark and end in a traceback
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"out: cannot use '{out_dir}' as the output folder ({err.strerror})") from None

    result = suite.Bench(bench_cfg).run(skip=skip)
    target_rows = targets.evaluate(result)
    paths = report.write_all(result, target_rows, out_dir)
    print(report.render(result, target_rows))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0
