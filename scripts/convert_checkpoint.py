"""Convert a checkpoint that the project now refuses (it holds Python objects) into a safe one:
`python scripts/convert_checkpoint.py --trust <file> [--out <file>]`.

Every checkpoint read goes through the weights-only unpickler (anchormass/training/safe_load.py);
a file written by an earlier version of the project with a DictConfig, a Path or numpy values in
it is refused in one line. This command UNPICKLES the file with the full unpickler, which runs any
code a crafted file holds, so it only runs on a file named with --trust: one you (or your own
runs) wrote. See anchormass/training/convert_checkpoint.py. Bad input exits 2 with one line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from anchormass.cli import exit_on_error  # noqa: E402


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Rewrite a checkpoint that holds Python objects (DictConfig, Path, numpy values) with "
                    "plain values only, so the project's weights-only reader accepts it. WARNING: this "
                    "UNPICKLES the file (torch.load weights_only=False): a crafted file runs arbitrary code "
                    "as you. Use it only on a file you trust.")
    p.add_argument("--trust", required=True, metavar="FILE", type=Path,
                   help="the checkpoint to convert; naming it here says you trust it to unpickle")
    p.add_argument("--out", type=Path, default=None,
                   help="where to write the converted checkpoint (default: replace FILE, atomically)")
    return p


@exit_on_error
def main(argv: list[str]) -> None:
    from anchormass.training.convert_checkpoint import convert_trusted

    args = parser().parse_args(argv)
    replaced = convert_trusted(args.trust, args.out)
    what = ", ".join(f"{n} {kind}" for kind, n in sorted(replaced.items())) or "nothing to replace"
    print(f"converted {args.trust} -> {args.out or args.trust} ({what})")


if __name__ == "__main__":
    main(sys.argv[1:])
