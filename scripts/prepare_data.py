"""Prepare a dataset: `python scripts/prepare_data.py data=<name> [data.key=value ...]`.

Writes data/<name>/ (tokenizer.model, train.bin/val.bin + sidecars, meta.json); see
anchormass/data/prepare.py. Example: `python scripts/prepare_data.py data=demo` (offline, seconds);
`data.out_dir=/tmp/x` writes elsewhere.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from anchormass.cli import check_group_choices, exit_on_error  # noqa: E402
from anchormass.data.prepare import prepare  # noqa: E402

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "configs")

# The primary config lives here (only the `data` group is in configs/): no run folder, no log file.
ConfigStore.instance().store(name="prepare_data", node={
    "defaults": [{"data": "demo"}, {"override hydra/job_logging": "none"}, {"override hydra/hydra_logging": "none"},
                 "_self_"],
    "hydra": {"output_subdir": None, "run": {"dir": "."}},
})


@exit_on_error
def run(cfg: DictConfig) -> None:
    out, meta = prepare(OmegaConf.to_container(cfg.data, resolve=True))
    print(json.dumps({"out_dir": str(out), "vocab_size": meta["vocab_size"], "splits": meta["splits"],
                      "seconds": meta["seconds"]}, indent=1))


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="prepare_data")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    check_group_choices(CONFIG_DIR, sys.argv[1:])
    main()
