"""Data preparation benchmark: `python scripts/bench_data.py [min_mb=100] [workers=[1,2]] [out=<dir>]`.

Tokens/s of scripts/prepare_data.py's pretraining path with 1 and 2 worker processes, side by side
in one run, on the real Aozora + JSQuAD text of ../shared/data (outside the checkout; the run says
so and exits 2 when it is missing) repeated to >= min_mb MB, with each run's peak RSS and a check
that the runs wrote identical files (anchormass/bench/data_prep.py). The scratch corpus and outputs
go to <out> (default outputs/bench/data); bench_data.json and bench_data.md land there too.
"""

from __future__ import annotations

import json
import sys

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from anchormass.cli import check_overrides, exit_on_error
from anchormass.errors import ConfigError
from anchormass.utils import CONFIG_ROOT, resolve_path

ConfigStore.instance().store(name="bench_data", node={
    "min_mb": 100, "workers": [1, 2], "out": "outputs/bench/data",
    "defaults": [{"override hydra/job_logging": "none"}, {"override hydra/hydra_logging": "none"}, "_self_"],
    "hydra": {"output_subdir": None, "run": {"dir": "."}},
})


@exit_on_error
def run(cfg: DictConfig) -> None:
    try:
        min_mb, workers = float(cfg.min_mb), tuple(int(w) for w in cfg.workers)
    except (TypeError, ValueError):
        raise ConfigError(f"min_mb must be a number and workers a list of whole numbers, got {cfg.min_mb!r}, "
                          f"{cfg.workers!r}") from None
    if min_mb <= 0 or not workers or min(workers) < 1:
        raise ConfigError("min_mb must be > 0 and workers a non-empty list of numbers >= 1 (e.g. workers=[1,2])")
    from anchormass.bench.data_prep import bench_data_prep

    out = resolve_path(cfg.out)
    print(bench_data_prep(out, min_mb, workers))
    print(json.dumps({"json": str(out / "bench_data.json")}))


@hydra.main(version_base="1.3", config_path=None, config_name="bench_data")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    # an unknown key: one line, exit 2 (the config is stored above; no file is read)
    check_overrides(CONFIG_ROOT, "bench_data", sys.argv[1:])
    main()
