"""`export_checkpoint(ckpt, out)`: a training checkpoint -> a folder `transformers` loads offline.

Standard checkpoints become native LlamaForCausalLM folders (export_llama.py), AnchorMass ones
remote-code folders running this package (export_anchormass.py; `format="anchormass"` sends a
Standard checkpoint there too, to generate through our Standard cache and its KV policies).
Every folder gets the tokenizer (tokenizer_export.py) and anchormass_export.json (provenance.py).
The folder is written under a temporary name and renamed into place when complete.
Weights go out as safetensors only (tensors and a JSON header: loading them runs nothing); a folder
holding a pickled weight file is never published (`check_safetensors_only`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from anchormass.errors import CheckpointError, ConfigError, DataError
from anchormass.utils import give_usual_modes, writable_dir

FORMATS = ("auto", "llama", "anchormass")
# Weight files in pickle formats (transformers' pytorch_model.bin, torch .pt/.pth/.ckpt, raw pickles).
PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        raise ConfigError(f"out {out} already exists and is not empty; choose a new folder")


def check_safetensors_only(folder: Path) -> None:
    """An export's weights are *.safetensors and nothing is pickled: a reader of the folder
    (`from_pretrained`) deserialises tensors only."""
    pickled = sorted(p.name for pattern in PICKLED_WEIGHTS for p in folder.glob(pattern))
    if pickled or not any(folder.glob("*.safetensors")):
        raise CheckpointError(f"export {folder} must hold its weights as safetensors only, found "
                              f"{pickled or 'no *.safetensors'}; nothing was published")


def _quiet_transformers() -> None:
    """No progress bars or advice from transformers while writing: the command prints one summary."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def load_source(ckpt: str | Path, tokenizer: str | Path | None = None):
    """(model, hparams, Tokenizer) of a training checkpoint; the tokenizer from hparams unless given."""
    from anchormass.data.tokenizer_loader import load_tokenizer
    from anchormass.training.checkpoint import check_tokenizer, load_model
    from anchormass.training.checkpoint_tokenizer import checkpoint_tokenizer

    model, hparams = load_model(ckpt)
    tok_path = Path(str(tokenizer)).expanduser() if tokenizer is not None else checkpoint_tokenizer(hparams, ckpt)
    if tok_path is None:
        raise ConfigError(f"checkpoint {ckpt} names no tokenizer: pass tokenizer=<path to tokenizer.model>")
    if not tok_path.exists():
        raise DataError(f"tokenizer not found: {tok_path} (pass tokenizer=<path to tokenizer.model>)")
    tok = load_tokenizer(tok_path)
    check_tokenizer(tok, hparams, model.cfg.vocab_size, Path(ckpt).stem)
    return model, hparams, tok


def export_checkpoint(ckpt: str | Path, out: str | Path, tokenizer: str | Path | None = None,
                      format: str = "auto") -> Path:
    """Write the export of `ckpt` into the new folder `out`; returns `out`."""
    from anchormass.hf.export_anchormass import export_anchormass
    from anchormass.hf.export_llama import export_llama
    from anchormass.hf.provenance import write_provenance
    from anchormass.hf.tokenizer_export import export_tokenizer

    if format not in FORMATS:
        raise ConfigError(f"format must be one of {FORMATS}, got {format!r}")
    out = Path(out).expanduser()
    _check_out(out)
    writable_dir(out.parent, f"out={out}: its folder")  # before the checkpoint is loaded
    model, hparams, tok = load_source(ckpt, tokenizer)
    arch = model.cfg.arch
    if format == "llama" and arch != "standard":
        raise ConfigError(f"format=llama needs a Standard checkpoint; {ckpt} is {arch}")
    as_llama = format == "llama" or (format == "auto" and arch == "standard")
    staging = out.parent / f".{out.name}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    _quiet_transformers()
    try:
        special = tok.special_ids()
        (export_llama if as_llama else export_anchormass)(model, staging, special)
        export_tokenizer(tok, staging)
        write_provenance(staging, Path(ckpt), arch, {
            "format": "llama" if as_llama else "anchormass", "tokenizer": str(Path(tok.path).resolve()),
            "tokenizer_sha256": tok.checksum, "trained_lengths": hparams.get("trained_lengths")})
        check_safetensors_only(staging)
        give_usual_modes(staging)
        if out.exists():
            out.rmdir()  # empty (checked above)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out
