"""Import a Hugging Face Llama: `python scripts/import_hf.py` or `anchormass-import` `src=<folder|file.gguf> out=<dir>`.

`src` is a `transformers` Llama folder (config.json + *.safetensors) or a GGUF file; `out` gets our
Standard checkpoint (model.ckpt: load_model, evaluate.py ckpt=, export, train.py init_from=), the
tokenizer as a `transformers` folder (tokenizer/) and import.json. A model our Standard cannot
represent exactly (biases, a sliding window, RoPE scaling, another architecture) is refused in one
line naming the field. `global_groups=[g, ...]` reorders each layer's KV groups so that those groups
are AnchorMass's global heads after `init_across_arch=true` (the Standard's function is unchanged).
See anchormass/hf/import_checkpoint.py. Bad input exits 2 with one line.
"""

from __future__ import annotations

import json

import hydra
from omegaconf import DictConfig, OmegaConf

from anchormass.cli import exit_on_error
from anchormass.command_names import command
from anchormass.commands.arguments import check_arguments, require_paths
from anchormass.utils import CONFIG_ROOT


@exit_on_error
def run(cfg: DictConfig) -> None:
    require_paths(cfg, ("src", "out"), f"{command('scripts/import_hf.py')} src=<folder|file.gguf> out=<dir>")
    from anchormass.extras import require

    require("hf", "import", ["transformers", "safetensors", "tokenizers", "gguf"])  # before anything is read
    from anchormass.hf.import_checkpoint import import_llama

    groups = cfg.get("global_groups")
    groups = OmegaConf.to_container(groups) if OmegaConf.is_config(groups) else groups
    name = cfg.get("name")
    summary = import_llama(str(cfg.src), str(cfg.out), name=None if name is None else str(name),
                           global_groups=groups)
    print(json.dumps(summary))


@hydra.main(version_base="1.3", config_path=str(CONFIG_ROOT), config_name="import_hf")
def main(cfg: DictConfig) -> None:
    run(cfg)


def cli() -> None:
    """`python scripts/import_hf.py ...` and `anchormass-import ...`."""
    check_arguments("scripts/import_hf.py", __doc__, "import_hf", [])
    main()


if __name__ == "__main__":
    cli()
