#!/usr/bin/env python
"""Standard vs AnchorMass, side by side in one process: prefill, training step, decode, cache bytes,
peak memory, and the targets as measured ratios with PASS / MISS.

    python scripts/bench.py threads=1            # CPU, mini configs (<= 5 min)
    python scripts/bench.py device=cuda          # GPU, 158m models, 4K .. 256K
    python scripts/bench.py preset=toy           # seconds: tiny models, short sequences

Options: configs/bench.yaml. Writes <out>/bench.md, bench.json and bench.png (default out:
outputs/bench/<preset>). On a machine shared with other jobs, pass threads=1: oversubscribed
intra-op threads spin and inflate wall-clock times several-fold (the tables also give every time
ratio on CPU time).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, ListConfig

from anchormass.bench.suite import SECTIONS
from anchormass.cli import check_group_choices, exit_on_error
from anchormass.config_checks import check_numbers
from anchormass.errors import ConfigError
from anchormass.utils import CONFIG_ROOT

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


@exit_on_error
def run(cfg: DictConfig) -> int:
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


@hydra.main(version_base="1.3", config_path=str(CONFIG_ROOT), config_name="bench")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    check_group_choices(CONFIG_ROOT, sys.argv[1:])
    main()
