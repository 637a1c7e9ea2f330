"""Prepare a dataset: `python scripts/prepare_data.py` or `anchormass-prepare` `data=<name> [data.key=value ...]`.

Writes data/<name>/ (tokenizer.model or an imported tokenizer/ folder, train.bin/val.bin + sidecars,
meta.json); see anchormass/data/prepare.py. Example: `python scripts/prepare_data.py data=demo`
(offline, seconds); `data.out_dir=/tmp/x` writes elsewhere; `tokenizer=<path>` (short for
data.tokenizer.path) tokenises with an existing tokenizer: a SentencePiece .model file or a Hugging
Face tokenizer folder, e.g. `data=english_docs tokenizer=<imported checkpoint>/tokenizer`.
"""

from __future__ import annotations

import json

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from anchormass.cli import exit_on_error
from anchormass.commands.arguments import check_arguments
from anchormass.config_checks import check_required
from anchormass.utils import CONFIG_ROOT

# The primary config lives here (only the `data` group is in configs/): no run folder, no log file.
ConfigStore.instance().store(name="prepare_data", node={
    "defaults": [{"data": "demo"}, {"override hydra/job_logging": "none"}, {"override hydra/hydra_logging": "none"},
                 "_self_"],
    "tokenizer": None,  # tokenizer=<path>: data.tokenizer.path, shorter (check_data_config moves it there)
    "hydra": {"output_subdir": None, "run": {"dir": "."}},
})


@exit_on_error
def run(cfg: DictConfig) -> None:
    from anchormass.data.prepare import prepare

    check_data_config(cfg)
    out, meta = prepare(OmegaConf.to_container(cfg.data, resolve=True))
    print(json.dumps(summary(out, meta), indent=1))


def summary(out, meta: dict) -> dict:
    """What the command prints: a dataset's vocabulary and splits, or for one shard of K (not a
    dataset: its vocabulary is under `dataset`, and it has no splits until merge_data.py draws them)
    which shard it is and the merge that follows."""
    from anchormass.data.shards import SHARD_KIND

    if meta.get("kind") != SHARD_KIND:
        return {"out_dir": str(out), "vocab_size": meta["vocab_size"], "splits": meta["splits"],
                "seconds": meta["seconds"]}
    shard = meta["shard"]
    pattern = out.with_name(out.name.replace(f"shard-{shard['index']}-of", "shard-*-of"))
    return {"out_dir": str(out), "shard": f"{shard['index']} of {shard['count']}",
            "vocab_size": meta["dataset"]["vocab_size"], "seconds": meta["seconds"],
            "next": f"python scripts/merge_data.py shards='{pattern}' once every shard is written"}


def check_data_config(cfg: DictConfig) -> None:
    if cfg.get("tokenizer"):  # before the check: it fills a required data.tokenizer.path
        OmegaConf.update(cfg, "data.tokenizer.path", str(cfg.tokenizer), force_add=True)
    check_required(cfg.data)  # data=alpaca without data.tokenizer.path (keys are named from the root)


@hydra.main(version_base="1.3", config_path=str(CONFIG_ROOT), config_name="prepare_data")
def main(cfg: DictConfig) -> None:
    run(cfg)


def cli() -> None:
    """`python scripts/prepare_data.py ...` and `anchormass-prepare ...`."""
    check_arguments("scripts/prepare_data.py", __doc__, "prepare_data", ["data"], options_in_help=False,
                    follow_runner=True, check=check_data_config)
    main()


if __name__ == "__main__":
    cli()
