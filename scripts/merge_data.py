"""Merge shard folders into one prepared dataset:
`python scripts/merge_data.py shards=[data/x.shard-0-of-2,data/x.shard-1-of-2] [out_dir=data/x]`.

A corpus prepared on K machines (`prepare_data.py data=<name> data.num_shards=K data.shard_index=i`,
one i per machine; each writes data/<name>.shard-i-of-K) merges into the very files a one-machine
`prepare_data.py data=<name>` writes (anchormass/data/merge.py). Globs work:
`shards='data/x.shard-*-of-2'`. out_dir defaults to data/<name>. Bad input exits 2 with one line.
"""

from __future__ import annotations

import json
import sys

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig

from anchormass.cli import check_overrides, exit_on_error
from anchormass.errors import ConfigError
from anchormass.utils import CONFIG_ROOT

ConfigStore.instance().store(name="merge_data", node={
    "shards": None, "out_dir": None,
    "defaults": [{"override hydra/job_logging": "none"}, {"override hydra/hydra_logging": "none"}, "_self_"],
    "hydra": {"output_subdir": None, "run": {"dir": "."}},
})


@exit_on_error
def run(cfg: DictConfig) -> None:
    shards = cfg.shards
    if not shards:
        raise ConfigError("shards=[<folder>,...] is required (python scripts/merge_data.py "
                          "shards=[data/x.shard-0-of-2,data/x.shard-1-of-2])")
    from anchormass.data.merge import merge_shards

    paths = [str(s) for s in shards] if isinstance(shards, (list, ListConfig)) else [str(shards)]
    out, meta = merge_shards(paths, cfg.out_dir)
    print(json.dumps({"out_dir": str(out), "vocab_size": meta["vocab_size"], "splits": meta["splits"],
                      "seconds": meta["seconds"]}, indent=1))


@hydra.main(version_base="1.3", config_path=None, config_name="merge_data")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    # an unknown key: one line, exit 2 (the config is stored above; no file is read)
    check_overrides(CONFIG_ROOT, "merge_data", sys.argv[1:])
    main()
