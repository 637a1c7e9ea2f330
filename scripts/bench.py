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

import hydra
from omegaconf import DictConfig

from anchormass.cli import check_group_choices, check_overrides, exit_on_error
from anchormass.utils import CONFIG_ROOT


@hydra.main(version_base="1.3", config_path=str(CONFIG_ROOT), config_name="bench")
@exit_on_error
def main(cfg: DictConfig) -> None:
    from anchormass.bench.run import run_bench

    run_bench(cfg)


if __name__ == "__main__":
    check_group_choices(CONFIG_ROOT, sys.argv[1:])
    check_overrides(CONFIG_ROOT, "bench", sys.argv[1:])  # an unknown key: one line, exit 2
    main()
