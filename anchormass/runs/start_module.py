"""The LightningModule a run starts with: the model preset sized to its data, and the checkpoint it
starts from (`init_from`: weights only; `ckpt_path`: a resume, restored by Lightning) checked to be
the same architecture and tokenizer first."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from anchormass.data.dataset_dir import fingerprint
from anchormass.data.tokenizer_loader import load_tokenizer, tokenizer_in
from anchormass.errors import CheckpointError
from anchormass.models.config import FIELDS_ADDED_LATER, TENSOR_FIELDS, load_model_config
from anchormass.runs.resume_settings import check_resume_settings
from anchormass.training.checkpoint import load_weights, read_checkpoint
from anchormass.training.checkpoint_tokenizer import carried
from anchormass.training.lit_module import LitLanguageModel
from anchormass.utils import resolve_path


def resolve_model_config(cfg: DictConfig, meta: dict):
    """The model preset with its vocab taken from the prepared data (the demo vocab is small)."""
    model_cfg = load_model_config(cfg.model)
    vocab = meta.get("vocab_size")
    if cfg.get("vocab_from_data", True) and vocab:
        model_cfg = model_cfg.replace(vocab_size=int(vocab))
    return model_cfg


# Fields that make two models different architectures even when their tensors have equal shapes
# (Standard and AnchorMass have identical parameter lists).
ARCH_FIELDS = ("arch", *TENSOR_FIELDS, "n_local_heads", "n_global_heads", "outlier_scorer")


# What `init_across_arch=true` lets differ: Standard <-> AnchorMass with the same tensors (uptraining
# a Standard checkpoint into AnchorMass, or a curriculum's shared stage, docs/method.md §5), and the
# rule's outlier choice <-> a learned one (the scorers a checkpoint lacks keep their init; a resume,
# which must restore every tensor, is refused in one line).
ACROSS_ARCH_FIELDS = ("arch", "n_local_heads", "n_global_heads", "outlier_scorer")


def check_same_architecture(saved: dict, model_cfg, path, across_arch: bool = False) -> None:
    now = model_cfg.to_dict()
    saved = {**FIELDS_ADDED_LATER, **saved}  # a checkpoint older than a field has its earlier value
    differ = [k for k in ARCH_FIELDS if saved.get(k) != now[k] and not (across_arch and k in ACROSS_ARCH_FIELDS)]
    if differ:
        detail = "; ".join(f"{k}: {saved.get(k)} in checkpoint vs {now[k]}" for k in differ)
        hint = ("; init_across_arch=true starts one architecture from the other's weights"
                if not across_arch and set(differ) <= set(ACROSS_ARCH_FIELDS) else "")
        raise CheckpointError(f"{path} is a different model ({detail}){hint}")


def check_same_tokenizer(saved: dict, meta: dict, path, data_dir: Path) -> None:
    """Token ids only mean the same thing under the same tokenizer: a stage's data must be
    tokenized like the data its starting checkpoint was trained on."""
    before, now = saved.get("tokenizer_checksum"), meta.get("tokenizer_checksum")
    if before and now and before != now:
        raise CheckpointError(f"init_from {path} was trained with tokenizer {before[:12]}, but {data_dir} is "
                              f"tokenized with {now[:12]}; prepare the data with the checkpoint's tokenizer")


def stage_objective(cfg: DictConfig, start_ckpt: dict | None) -> dict | None:
    """The stage's objective with its teacher made explicit (training/objectives.py): attention
    transfer learns from `objective.teacher`, else from the checkpoint a fresh stage starts from;
    a resume keeps the teacher its run began with (the curriculum resumes with ckpt_path=last and
    no init_from)."""
    objective = OmegaConf.to_container(cfg.stage.objective, resolve=True) if cfg.stage.get("objective") else None
    if not objective or objective.get("kind") != "attention_transfer":
        return objective
    teacher = objective.get("teacher")
    if not teacher and cfg.get("ckpt_path") and start_ckpt is not None:
        teacher = (start_ckpt["hyper_parameters"].get("objective") or {}).get("teacher")
    if not teacher and cfg.get("init_from"):
        teacher = cfg.init_from
    return {**objective, "teacher": str(resolve_path(teacher)) if teacher else None}


def build_module(cfg: DictConfig, data_dir: Path, meta: dict) -> LitLanguageModel:
    model_cfg = resolve_model_config(cfg, meta)
    start = cfg.get("ckpt_path") or cfg.get("init_from")
    start_ckpt = read_checkpoint(start) if start else None
    if start_ckpt is not None:
        # a resume continues the same run; only a fresh start may cross architectures
        across = bool(cfg.get("init_across_arch", False)) and not cfg.get("ckpt_path")
        check_same_architecture(start_ckpt["hyper_parameters"]["model_config"], model_cfg, start, across)
    resume_changes = (check_resume_settings(start_ckpt, cfg, fingerprint(data_dir), start)
                      if start_ckpt is not None and cfg.get("ckpt_path") else [])
    # Lengths trained so far (RoPE original_max_len) come from the run we continue or start from.
    trained_lengths = list(start_ckpt["hyper_parameters"].get("trained_lengths", [])) if start_ckpt else []
    # tokenizer.model, or an imported tokenizer's folder: the checkpoint carries its bytes (checkpoint_tokenizer.py)
    tokenizer = tokenizer_in(data_dir, meta).resolve()
    module = LitLanguageModel(
        model_config=model_cfg.to_dict(), total_steps=cfg.stage.total_steps, seq_len=cfg.stage.seq_len,
        optim=OmegaConf.to_container(cfg.optim, resolve=True), trained_lengths=trained_lengths,
        tokenizer_path=str(tokenizer) if tokenizer.exists() else None,
        tokenizer_files=carried(load_tokenizer(tokenizer)) if tokenizer.exists() else None,
        data_fingerprint=fingerprint(data_dir), stage=str(cfg.stage.name),
        loss_chunk=int(cfg.stage.get("loss_chunk", 1024)), tokenizer_checksum=meta.get("tokenizer_checksum"),
        objective=stage_objective(cfg, start_ckpt), trainable=str(cfg.stage.get("trainable", "all")))
    if start_ckpt is not None and not cfg.get("ckpt_path"):
        # init_from: weights only (a resume gets everything from Lightning's own restore).
        check_same_tokenizer(start_ckpt["hyper_parameters"], meta, start, data_dir)
        load_weights(module.model, start_ckpt, start, fresh_start=True)
    module.resume_changes = resume_changes  # made to take effect by ResumeOverrides (resume_settings.py)
    return module

