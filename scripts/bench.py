#!/usr/bin/env python
"""Standard vs AnchorMass, side by side in one process: prefill, training step, decode, cache bytes,
peak memory, and the issue-7 targets as measured ratios with PASS / MISS.

    python scripts/bench.py                      # CPU, mini configs (<= 5 min)
    python scripts/bench.py --device cuda        # GPU, 158m models, 4K .. 256K
    python scripts/bench.py --preset toy         # seconds: tiny models, short sequences

Writes <out>/bench.md, bench.json and bench.png (default out: outputs/bench/<preset>).
On a machine shared with other jobs, pass --threads 1: oversubscribed intra-op threads spin and
inflate wall-clock times several-fold (the tables also give every time ratio on CPU time).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from anchormass.cli import exit_on_error  # noqa: E402
from anchormass.errors import ConfigError  # noqa: E402

from anchormass.bench.suite import SECTIONS  # noqa: E402


def _lengths(text: str) -> list[int]:
    """'8K,32K' or '8192,32768' -> [8192, 32768]."""
    out = []
    for part in filter(None, text.split(",")):
        part = part.strip().upper()
        try:
            out.append(int(part[:-1]) * 1024 if part.endswith("K") else int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad length '{part}' (use e.g. 8K or 8192)") from None
    if not out or min(out) <= 0:
        raise argparse.ArgumentTypeError("need one or more positive lengths")
    return out


def _shapes(text: str) -> list[list[int]]:
    """'4x1K,1x4K' -> [[4, 1024], [1, 4096]] (batch x sequence length)."""
    out = []
    for part in filter(None, text.split(",")):
        batch, _, seq = part.strip().upper().partition("X")
        try:
            out.append([int(batch), _lengths(seq)[0]])
        except (ValueError, argparse.ArgumentTypeError):
            raise argparse.ArgumentTypeError(f"bad shape '{part}' (use e.g. 4x1K)") from None
    if not out or min(b for b, _ in out) <= 0:
        raise argparse.ArgumentTypeError("need one or more shapes like 4x1K")
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2, like every other bad input
        raise ConfigError(f"{self.prog}: {message}")


def parse_args(argv=None) -> argparse.Namespace:
    p = _Parser(prog="bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default=None, help="cpu_mini (default on CPU), cuda_158m (default on CUDA), toy")
    p.add_argument("--device", default=None, choices=("cpu", "cuda"), help="default: the preset's (cpu)")
    p.add_argument("--out", default=None, help="output folder (default outputs/bench/<preset>)")
    p.add_argument("--standard", help="Standard model preset or YAML")
    p.add_argument("--anchormass", help="AnchorMass model preset or YAML")
    p.add_argument("--dtype", help="float32 / bfloat16 / float16")
    p.add_argument("--repeats", type=int, help="timed repeats (after warm-up) for prefill and training")
    p.add_argument("--warmup", type=int)
    p.add_argument("--decode-windows", type=int)
    p.add_argument("--decode-budget", type=int, help="AnchorMass slot budget in decode and memory sessions")
    p.add_argument("--prefill-lengths", type=_lengths)
    p.add_argument("--decode-lengths", type=_lengths)
    p.add_argument("--memory-lengths", type=_lengths)
    p.add_argument("--train-shapes", type=_shapes, help="batch x length list, e.g. 4x1K,1x4K")
    p.add_argument("--chunk", type=int, help="prefill chunk size")
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--skip", default="", help=f"comma list of sections to skip: {','.join(SECTIONS)}")
    p.add_argument("--seed", type=int)
    return p.parse_args(argv)


@exit_on_error
def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from anchormass.bench import report, suite, targets

    name = args.preset or ("cuda_158m" if args.device == "cuda" else "cpu_mini")
    overrides = {k: v for k, v in {
        "standard": args.standard, "anchormass": args.anchormass, "dtype": args.dtype, "repeats": args.repeats,
        "warmup": args.warmup, "decode_windows": args.decode_windows, "decode_budget": args.decode_budget,
        "prefill_lengths": args.prefill_lengths, "decode_lengths": args.decode_lengths,
        "memory_lengths": args.memory_lengths, "train_shapes": args.train_shapes, "chunk": args.chunk,
        "seed": args.seed}.items() if v is not None}
    if args.device is not None:
        overrides["device"] = args.device
    cfg = suite.preset(name, **overrides)
    for key in ("repeats", "decode_windows", "chunk", "decode_budget"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"--{key.replace('_', '-')} must be >= 1, got {getattr(cfg, key)}")
    skip = [s for s in args.skip.split(",") if s]
    unknown = sorted(set(skip) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"--skip: unknown section(s) {unknown}; sections are {', '.join(SECTIONS)}")
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    out_dir = Path(args.out or Path("outputs") / "bench" / name)
    try:  # before the run: a bad --out must not cost a whole benchmark and end in a traceback
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"--out: cannot use '{out_dir}' as the output folder ({err.strerror})") from None

    result = suite.Bench(cfg).run(skip=skip)
    target_rows = targets.evaluate(result)
    paths = report.write_all(result, target_rows, out_dir)
    print(report.render(result, target_rows))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
