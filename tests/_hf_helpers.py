"""Shared by tests/test_hf_*.py and tests/test_lm_eval*.py: a tiny tokenizer and tiny checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch

from anchormass.data.testing import tiny_pretrain
from anchormass.models import build_model, load_model_config
from anchormass.training.checkpoint import atomic_torch_save

VOCAB = 400  # tiny_pretrain's tokenizer size: a 28K LM head would dominate the runtime


def tiny_tokenizer(base: Path) -> Path:
    """tokenizer.model of a tiny prepared demo corpus (BPE, 400 ids, reserved chat ids)."""
    return tiny_pretrain(base / "pretrain") / "tokenizer.model"


def tiny_checkpoint(path: Path, preset: str, tokenizer: Path, seed: int = 0, **changes) -> Path:
    """A training-format checkpoint of a random-init `preset` (vocab VOCAB).

    init_std defaults to 0.2 instead of 0.02: peaked next-token distributions, so greedy decoding
    compares real choices rather than near-ties of an almost uniform softmax."""
    cfg = load_model_config(preset).replace(**{"vocab_size": VOCAB, "init_std": 0.2, **changes})
    torch.manual_seed(seed)
    model = build_model(cfg)
    atomic_torch_save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                       "hyper_parameters": {"model_config": cfg.to_dict(), "tokenizer_path": str(tokenizer),
                                            "trained_lengths": [cfg.original_max_len]}}, path)
    return path
