"""AnchorMass (or any) checkpoint -> a `trust_remote_code` folder whose code is this package.

The folder: config.json (our ModelConfig inside, `auto_map` naming the classes),
model.safetensors (our parameters under "model."), generation_config.json and a two-line
`modeling_anchormass.py` that imports `anchormass.hf.modeling`: loading needs this package
installed from its repository, and runs exactly our model and session cache. Without it, loading
fails with the install command of the code the folder was exported from (`install_command`),
not transformers' own `pip install anchormass`, a PyPI name that is not this project.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import torch

from anchormass.utils import CHECKOUT, atomic_write_text, git_commit

MODELING_FILE = "modeling_anchormass.py"
# transformers lists a remote-code file's imports and refuses a missing one with `pip install
# <module name>`; imports inside `try` are left to the file, which names the real source instead.
MODELING_TEMPLATE = '''"""Written by anchormass (scripts/export_hf.py): the model code is the `anchormass` package."""

try:
    from anchormass.hf.modeling import AnchorMassForCausalLM, AnchorMassHFConfig
except ModuleNotFoundError as err:
    if err.name != "anchormass":
        raise
    raise ImportError("this model runs the anchormass package's own code, which is not installed here; "
                      "install it from its repository: {install}") from None

__all__ = ["AnchorMassForCausalLM", "AnchorMassHFConfig"]
'''


def install_command(checkout: Path | None = CHECKOUT) -> str:
    """How to install the code an export comes from: its git remote at the commit when the
    checkout has one, else the checkout folder itself (the same machine)."""
    if checkout is None:  # exported by an installed copy: its source is not known here
        return "pip install <a checkout of the AnchorMass repository, or git+<its URL>>"
    try:
        url = subprocess.run(["git", "remote", "get-url", "origin"], cwd=checkout, capture_output=True,
                             text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        url = ""
    commit = (git_commit(checkout) or "").removesuffix("-dirty")
    if url:
        return f'pip install "git+{url}' + (f'@{commit}"' if commit else '"')
    return f"pip install {checkout}" + (f" (commit {commit})" if commit else "")


def modeling_source(install: str | None = None) -> str:
    return MODELING_TEMPLATE.replace("{install}", (install or install_command()).replace('"', '\\"'))
AUTO_MAP = {"AutoConfig": "modeling_anchormass.AnchorMassHFConfig",
            "AutoModelForCausalLM": "modeling_anchormass.AnchorMassForCausalLM"}


def hf_wrapper(model, special_ids: dict[str, int]):
    """Our LanguageModel inside an `AnchorMassForCausalLM` (sharing its parameters)."""
    from anchormass.hf.modeling import AnchorMassForCausalLM, AnchorMassHFConfig

    config = AnchorMassHFConfig(model_config=model.cfg.to_dict(), bos_token_id=special_ids["bos"],
                                eos_token_id=special_ids["eos"], pad_token_id=special_ids["pad"])
    config.auto_map = dict(AUTO_MAP)
    config.architectures = ["AnchorMassForCausalLM"]
    with torch.device("meta"):
        hf = AnchorMassForCausalLM(config)
    hf.model = model  # our parameters, not copies
    hf.generation_config.bos_token_id = special_ids["bos"]
    hf.generation_config.eos_token_id = special_ids["eos"]
    hf.generation_config.pad_token_id = special_ids["pad"]
    return hf.eval()


def export_anchormass(model, out_dir: str | Path, special_ids: dict[str, int]) -> None:
    hf = hf_wrapper(model, special_ids)
    hf.save_pretrained(str(out_dir), safe_serialization=True)
    atomic_write_text(Path(out_dir) / MODELING_FILE, modeling_source())
