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

from pathlib import Path

from anchormass.errors import CheckpointError, ConfigError, DataError
from anchormass.hf.new_folder import check_new_folder, staged_folder

FORMATS = ("auto", "llama", "anchormass")
# Weight files in pickle formats (transformers' pytorch_model.bin, torch .pt/.pth/.ckpt, raw pickles).
PICKLED_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")


def check_safetensors_only(folder: Path) -> None:
    """An export's weights are *.safetensors and nothing is pickled: a reader of the folder
    (`from_pretrained`) deserialises tensors only."""
    pickled = sorted(p.name for pattern in PICKLED_WEIGHTS for p in folder.glob(pattern))
    if pickled or not any(folder.glob("*.safetensors")):
        raise CheckpointError(f"export {folder} must hold its weights as safetensors only, found "
                              f"{pickled or 'no *.safetensors'}; nothing was published")


def quiet_transformers() -> None:
    """No progress bars or advice from transformers while writing: the command prints one summary."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def load_source(ckpt: str | Path, tokenizer: str | Path | None = None):
    """(model, hparams, Tokenizer) of a training checkpoint; the tokenizer from hparams unless given."""
    from anchormass.data.tokenizer_loader import load_tokenizer
    from anchormass.training.checkpoint import check_tokenizer, load_model
    from anchormass.training.checkpoint_shapes import check_claimed_shapes
    from anchormass.training.checkpoint_tokenizer import checkpoint_tokenizer
    from anchormass.training.safe_load import safe_torch_load

    if Path(ckpt).is_file():  # a missing file is load_model's one line
        check_claimed_shapes(safe_torch_load(ckpt, mmap=True), ckpt)  # its config asks for what it holds
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
    check_new_folder(out)  # before the checkpoint is loaded
    model, hparams, tok = load_source(ckpt, tokenizer)
    arch = model.cfg.arch
    if format == "llama" and arch != "standard":
        raise ConfigError(f"format=llama needs a Standard checkpoint; {ckpt} is {arch}")
    as_llama = format == "llama" or (format == "auto" and arch == "standard")
    quiet_transformers()
    with staged_folder(out) as staging:
        special = tok.special_ids()
        (export_llama if as_llama else export_anchormass)(model, staging, special)
        export_tokenizer(tok, staging)
        write_provenance(staging, Path(ckpt), arch, {
            "format": "llama" if as_llama else "anchormass", "tokenizer": str(Path(tok.path).resolve()),
            "tokenizer_sha256": tok.checksum, "trained_lengths": hparams.get("trained_lengths")})
        check_safetensors_only(staging)
    return out
