"""`import_llama(src, out)`: a Hugging Face Llama (safetensors folder or GGUF file) -> a new folder

    <out>/model.ckpt     our Standard model as a training-format checkpoint (plain tensors and values,
                         read weights-only like every checkpoint): load_model, evaluate.py ckpt=,
                         export_hf and train.py init_from= take it
    <out>/tokenizer/     the source's tokenizer as a `transformers` folder (tokenizer.json,
                         tokenizer_config.json with its chat template); the checkpoint names it
    <out>/import.json    where it came from (path, kind, sha256 of the files read) and the head order

A source our Standard cannot represent exactly is refused in one line naming the field
(import_llama.py). Before anything is written, our model's logits on a short sequence are compared with
`transformers`' own forward of the source: a field nobody checked cannot slip through as a different
model. The folder appears complete or not at all (new_folder.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from anchormass.errors import CheckpointError, ConfigError
from anchormass.utils import atomic_write_json, code_version, sha256_file

CHECKPOINT_FILE = "model.ckpt"
TOKENIZER_DIR = "tokenizer"
IMPORT_FILE = "import.json"
SELF_CHECK_TOKENS = 16
# Relative to the largest logit: a faithful import differs by float rounding (SmolLM2-135M: 6.5e-5 of logits
# up to 41, 1.6e-6 relative), a wrong one (say RoPE halves swapped) by a sizeable fraction of the logits.
SELF_CHECK_REL = 1e-4


def default_name(src: Path) -> str:
    """standard_<the source's name as a preset name>: SmolLM2-135M-Instruct.Q4_1.gguf ->
    standard_smollm2_135m_instruct_q4_1."""
    stem = src.name[:-len(src.suffix)] if src.suffix.lower() == ".gguf" else src.name
    return "standard_" + (re.sub(r"[^a-z0-9]+", "_", stem.lower()).strip("_") or "imported")


def _source_files(source) -> dict[str, str]:
    """sha256 of each file the import read weights or config from, by name."""
    if source.kind == "gguf":
        return {source.path.name: sha256_file(source.path)}
    files = sorted(source.path.glob("*.safetensors")) + [source.path / "config.json"]
    return {p.name: sha256_file(p) for p in files}


def _self_check(ours, hf_model, cfg) -> float:
    """Max |logit difference| between our model and the source's transformers forward."""
    n = min(SELF_CHECK_TOKENS, cfg.original_max_len)
    ids = (torch.arange(n) * 7919 + 11) % cfg.vocab_size  # spread over the vocabulary, reproducible
    with torch.no_grad():
        ref = hf_model(ids[None]).logits
        diff = (ours(ids[None]) - ref).abs().max().item()
    allowed = SELF_CHECK_REL * max(1.0, ref.abs().max().item())
    if not diff <= allowed:
        raise CheckpointError(f"import check failed: our logits differ from transformers' by {diff:.3g} "
                              f"(> {allowed:.3g}); the source uses something our Standard does not "
                              f"represent; nothing was written")
    return diff


@dataclass
class Converted:
    """A source converted in memory: our Standard model, and the `transformers` model it came from."""

    cfg: Any  # ModelConfig
    model: torch.nn.Module  # ours, eval mode
    hf_model: torch.nn.Module
    tokenizer: Any  # the source's, as transformers reads it
    head_order: list[list[int]] | None  # each layer's KV groups in their new order (None: as in the source)
    self_check: float  # max |logit difference| on SELF_CHECK_TOKENS tokens


def convert(source, name: str | None = None, global_groups=None) -> Converted:
    """Read `source` (llama_source.LlamaSource) and build our Standard model holding its weights.

    `global_groups`: KV group indices (one list for every layer, or one per layer) to put last in each
    layer, as AnchorMass's global heads after an `init_across_arch` start (head_order.py); the model
    computes the same function. None keeps the source's order (the last third of the groups global).
    """
    from anchormass.hf.export import quiet_transformers
    from anchormass.hf.head_order import layer_orders, permute_kv_groups
    from anchormass.hf.import_llama import check_representable, our_config, our_state_dict
    from anchormass.models import build_model

    if name is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", str(name)):
        raise ConfigError(f"name must be a preset-style name (letters, digits, _ . -), got {name!r}")
    quiet_transformers()
    hf_config = source.config()
    check_representable(hf_config, source.path)  # before any weight is read
    orders, n_groups = None, None
    if global_groups is not None:
        n_kv = hf_config.num_key_value_heads or hf_config.num_attention_heads
        orders, n_groups = layer_orders(global_groups, n_kv, hf_config.num_hidden_layers)
    cfg = our_config(hf_config, name or default_name(source.path), n_groups)

    hf_model = source.model()
    state = our_state_dict(hf_model.state_dict(), cfg)
    if orders is not None:
        state = permute_kv_groups(state, cfg, orders)
    model = build_model(cfg)
    try:
        model.load_state_dict(state, strict=True)
    except (RuntimeError, KeyError) as err:
        raise CheckpointError(f"src={source.path}: its weights do not fit the model its config describes "
                              f"({str(err).strip().splitlines()[0]})") from None
    model.eval()
    return Converted(cfg, model, hf_model, source.tokenizer(), orders, _self_check(model, hf_model, cfg))


def save_tokenizer(tokenizer, folder: Path) -> None:
    """The source's tokenizer as a `transformers` folder, its chat template inside tokenizer_config.json
    (where every reader of such a folder finds it, old or new)."""
    tokenizer.save_pretrained(str(folder), save_jinja_files=False)


def write_import(converted: Converted, source, out: Path) -> dict:
    """Write `converted` and `source`'s tokenizer into the new folder `out`; returns the summary."""
    from anchormass.data.tokenizer_loader import load_tokenizer
    from anchormass.hf.new_folder import staged_folder
    from anchormass.training.checkpoint import STATE_PREFIX, atomic_torch_save, check_tokenizer
    from anchormass.training.checkpoint_tokenizer import carried

    cfg, model = converted.cfg, converted.model
    imported = {"source": str(source.path.resolve()), "kind": source.kind, "files_sha256": _source_files(source),
                "head_order": converted.head_order, "git_commit": code_version()}
    with staged_folder(out) as staging:
        save_tokenizer(converted.tokenizer, staging / TOKENIZER_DIR)
        # read back as the project reads it (data, evaluation, export): its checksum goes into the checkpoint
        tok = load_tokenizer(staging / TOKENIZER_DIR)
        check_tokenizer(tok, {}, cfg.vocab_size, cfg.name)
        hparams = {"model_config": cfg.to_dict(), "trained_lengths": [cfg.original_max_len],
                   "tokenizer_path": str(out.resolve() / TOKENIZER_DIR),  # where it is once the folder is in place
                   "tokenizer_checksum": tok.checksum, "tokenizer_files": carried(tok),  # checkpoint_tokenizer.py
                   "data_fingerprint": None, "stage": "import",
                   "imported_from": imported}
        atomic_torch_save({"state_dict": {STATE_PREFIX + k: v for k, v in model.state_dict().items()},
                           "hyper_parameters": hparams}, staging / CHECKPOINT_FILE)
        atomic_write_json(staging / IMPORT_FILE, {**imported, "checkpoint": CHECKPOINT_FILE,
                                                  "tokenizer": TOKENIZER_DIR, "model_config": cfg.to_dict(),
                                                  "self_check_max_abs_logit_diff": converted.self_check})
    return {"out": str(out), "checkpoint": str(out / CHECKPOINT_FILE), "tokenizer": str(out / TOKENIZER_DIR),
            "name": cfg.name, "params": sum(p.numel() for p in model.parameters()), "kind": source.kind,
            "self_check_max_abs_logit_diff": converted.self_check}


def import_llama(src: str | Path, out: str | Path, name: str | None = None, global_groups=None) -> dict:
    """Write the import of `src` into the new folder `out` (see `convert` for `global_groups`);
    returns a summary: out, checkpoint, tokenizer, name, params, kind, self-check difference."""
    from anchormass.hf.llama_source import open_source
    from anchormass.hf.new_folder import check_new_folder

    source = open_source(src)
    out = Path(out).expanduser()
    check_new_folder(out)
    converted = convert(source, name, global_groups)
    return write_import(converted, source, out)
