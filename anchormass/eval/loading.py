"""Turn the evaluate config into models and a tokenizer, checking everything before any suite runs.

Model A comes from `ckpt=<path>` or `model=<preset|dict>` (random init), model B (optional) from
`compare_ckpt=<path>` or `compare_model=<preset>`. Both must read the same tokenizer, so that a
comparison scores identical token sequences.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from anchormass.errors import CheckpointError, ConfigError, DataError
from anchormass.eval.suite import EvalModel
from anchormass.training.checkpoint import check_tokenizer
from anchormass.training.checkpoint_tokenizer import checkpoint_tokenizer
from anchormass.utils import sha256_file

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_device(name: str | None) -> torch.device:
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as err:
        raise ConfigError(f"device: cannot parse {name!r} ({err})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name} requested but CUDA is not available")
    return dev


def resolve_dtype(name: str | None) -> torch.dtype:
    name = name or "float32"
    if name not in DTYPES:
        raise ConfigError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def load_one(ckpt: Any, preset: Any, role: str, device: torch.device, dtype: torch.dtype,
             seed: int) -> EvalModel | None:
    """One model from a checkpoint or a preset (random init, seeded); None when neither is given.
    `role` names it in errors (e.g. "model A")."""
    if ckpt and preset:
        raise ConfigError(f"{role}: give a checkpoint or a model preset, not both")
    if ckpt:
        path = Path(str(ckpt)).expanduser()
        if not path.is_file():
            raise CheckpointError(f"checkpoint not found: {path}")
        from anchormass.training.checkpoint import load_model

        model, hparams = load_model(path, map_location="cpu")
        from anchormass.models.config import ModelConfig

        config = ModelConfig.from_dict(hparams["model_config"])
        source = str(path.resolve())
        label = config.name
        digest = sha256_file(path)
    elif preset:
        from anchormass.models import build_model
        from anchormass.models.config import load_model_config

        config = load_model_config(preset)
        torch.manual_seed(seed)  # random init, but reproducible
        model = build_model(config)
        hparams = {}
        source = f"random-init:{config.name}"
        label = config.name
        digest = None
    else:
        return None
    model.to(device=device, dtype=dtype).eval()
    return EvalModel(label=label, model=model, config=config, source=source, hparams=dict(hparams), sha256=digest)


def load_models(cfg: dict, device: torch.device, dtype: torch.dtype) -> list[EvalModel]:
    seed = int(cfg.get("seed", 0))
    from anchormass.training.checkpoint_shapes import check_claimed_shapes
    from anchormass.training.safe_load import safe_torch_load

    for key in ("ckpt", "compare_ckpt"):  # both opened safely (memory-mapped) before either model is built
        path = Path(str(cfg.get(key) or "")).expanduser()
        if cfg.get(key) and path.is_file():
            check_claimed_shapes(safe_torch_load(path, mmap=True), path)  # its config asks for what it holds
    a = load_one(cfg.get("ckpt"), cfg.get("model"), "model A", device, dtype, seed)
    if a is None:
        raise ConfigError("nothing to evaluate: pass ckpt=<path.ckpt> or model=<preset> (random init)")
    b = load_one(cfg.get("compare_ckpt"), cfg.get("compare_model"), "compare model", device, dtype, seed)
    models = [a] if b is None else [a, b]
    check_finite_weights(models, ["model A", "compare model"])
    if b is not None and a.label == b.label:
        a.label, b.label = f"{a.label} (A)", f"{b.label} (B)"
    factor = (cfg.get("limits") or {}).get("max_extrapolation")
    for m in models:
        m.max_context = None if factor is None else int(factor * m.config.original_max_len)
    return models


def check_finite_weights(models: list[EvalModel], roles: list[str]) -> None:
    """A model with nan / inf weights scores nan everywhere: a comparison with it has no result
    (scipy's Wilcoxon raised on its differences), so that is refused before any suite runs; one
    model alone is evaluated, with a warning that says why its table will read nan."""
    for m, role in zip(models, roles):
        bad = sum(int((~torch.isfinite(p)).sum()) for p in m.model.parameters())
        if not bad:
            continue
        total = sum(p.numel() for p in m.model.parameters())
        what = f"{role} ({m.source}) has {bad:,} non-finite weights (nan / inf) of {total:,}"
        if len(models) > 1:
            raise CheckpointError(f"{what}: a comparison with it has no result; evaluate it alone to see its "
                                  f"scores, or compare another checkpoint")
        print(f"warning: {what}: every score it gets will be nan", file=sys.stderr)


def tokenizer_path(cfg: dict, models: list[EvalModel]) -> Path | None:
    """`tokenizer=` wins; else the checkpoints' own tokenizer (they must agree; training/checkpoint_tokenizer.py)."""
    if cfg.get("tokenizer"):
        path = Path(str(cfg["tokenizer"])).expanduser()
        if not path.exists():
            raise DataError(f"tokenizer not found: {path}")
        return path
    found = [checkpoint_tokenizer(m.hparams, m.source) for m in models]  # None for a random-init model
    paths = [p for p in found if p is not None]
    if len(paths) == 2 and paths[0].resolve() != paths[1].resolve() \
            and _read_tokenizer(paths[0]).checksum != _read_tokenizer(paths[1]).checksum:
        raise CheckpointError(f"the two checkpoints use different tokenizers ({paths[0]} vs {paths[1]}); "
                              "a paired comparison needs identical token sequences")
    return paths[0] if paths else None


def _read_tokenizer(path: Path):
    """A SentencePiece file or a Hugging Face tokenizer folder (an imported model's)."""
    from anchormass.data.tokenizer_loader import load_tokenizer as read

    return read(path)


def load_tokenizer(path: Path, models: list[EvalModel]):
    tok = _read_tokenizer(path)
    for m in models:
        check_tokenizer(tok, m.hparams, m.config.vocab_size, m.label)
    return tok
