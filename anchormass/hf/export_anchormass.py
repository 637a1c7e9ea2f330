"""AnchorMass (or any) checkpoint -> a `trust_remote_code` folder whose code is this package.

The folder: config.json (our ModelConfig inside, `auto_map` naming the classes),
model.safetensors (our parameters under "model."), generation_config.json and a two-line
`modeling_anchormass.py` that imports `anchormass.hf.modeling`: loading needs this package
installed (`pip install .`), and runs exactly our model and session cache.
"""

from __future__ import annotations

from pathlib import Path

import torch

from anchormass.utils import atomic_write_text

MODELING_FILE = "modeling_anchormass.py"
MODELING_SOURCE = ('"""Written by anchormass (scripts/export_hf.py): '
                   '''the model code is the installed `anchormass` package."""

from anchormass.hf.modeling import AnchorMassForCausalLM, AnchorMassHFConfig

__all__ = ["AnchorMassForCausalLM", "AnchorMassHFConfig"]
''')
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
    atomic_write_text(Path(out_dir) / MODELING_FILE, MODELING_SOURCE)
