"""Export a checkpoint for `transformers`: `python scripts/export_hf.py` or `anchormass-export` `ckpt=<path> out=<dir>`.

Standard checkpoints become native LlamaForCausalLM folders; AnchorMass ones load with
`AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)` (needs this package
installed). Both carry the tokenizer and anchormass_export.json (source sha256, git commit).
See anchormass/hf/export.py. Bad input exits 2 with one line.
"""

from __future__ import annotations

import json

import hydra
from omegaconf import DictConfig

from anchormass.cli import exit_on_error
from anchormass.command_names import command
from anchormass.commands.arguments import check_arguments, require_paths
from anchormass.utils import CONFIG_ROOT


@exit_on_error
def run(cfg: DictConfig) -> None:
    require_paths(cfg, ("ckpt", "out"), f"{command('scripts/export_hf.py')} ckpt=<path.ckpt> out=<dir>")
    from anchormass.extras import require

    require("hf", "export")  # before the checkpoint loads
    from anchormass.hf.export import export_checkpoint
    from anchormass.hf.provenance import PROVENANCE_FILE

    out = export_checkpoint(cfg.ckpt, cfg.out, tokenizer=cfg.get("tokenizer"), format=str(cfg.get("format", "auto")))
    info = json.loads((out / PROVENANCE_FILE).read_text())
    print(json.dumps({"out": str(out), "format": info["format"], "source_sha256": info["source_sha256"]}))


@hydra.main(version_base="1.3", config_path=str(CONFIG_ROOT), config_name="export_hf")
def main(cfg: DictConfig) -> None:
    run(cfg)


def cli() -> None:
    """`python scripts/export_hf.py ...` and `anchormass-export ...`."""
    check_arguments("scripts/export_hf.py", __doc__, "export_hf", [], {"format": ["auto", "llama", "anchormass"]})
    main()


if __name__ == "__main__":
    cli()
