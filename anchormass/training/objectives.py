"""What a stage minimises, and which parameters may move (docs/method.md §6 l).

`stage.objective.kind`:
- `lm` (the default): next-token cross-entropy through the whole model (end to end);
- `attention_transfer`: layer-local attention transfer, the retrofit design LoLCATs uses for linear
  attention. A frozen teacher (a Standard checkpoint, by default the one the stage starts from)
  runs the sequence once without gradients; at every layer its normalised hidden state is fed to
  the student's attention alone, and the student's output is pulled towards the teacher's attention
  output on that same input. Each layer learns from its own loss and nothing is backpropagated
  through the network: the gradient of layer l's loss reaches only layer l's q/k/v/o projections.
  The loss of a layer is its squared error relative to the teacher output's mean square (so a
  layer with a large residual contribution does not drown the rest); the stage's loss is the mean
  over layers.

`stage.trainable`: `all` (the default) or `attention` (only the q/k/v/o projections get gradients
and optimizer state: embeddings, norms and MLPs stay as the starting checkpoint had them). An
attention-transfer stage trains attention only whatever it says, since nothing else is in its loss.
"""

from __future__ import annotations

import torch
from torch import nn

from anchormass.errors import CheckpointError, ConfigError
from anchormass.models.config import TENSOR_FIELDS

OBJECTIVES = ("lm", "attention_transfer")
TRAINABLE = ("all", "attention")
# the attention projections, and AnchorMass's learned outlier scorer (model.outlier_scorer=learned, §2.3)
ATTENTION_PARAMS = (".attn.q_proj.", ".attn.k_proj.", ".attn.v_proj.", ".attn.o_proj.", ".attn.outlier_score")


def check_objective(objective: dict | None, trainable: str) -> dict:
    """The objective as a plain dict {kind, teacher}; one-line ConfigError for anything else."""
    obj = dict(objective or {"kind": "lm"})
    kind = obj.get("kind", "lm")
    if kind not in OBJECTIVES or set(obj) - {"kind", "teacher"}:
        raise ConfigError(f"stage.objective must be {{kind: one of {list(OBJECTIVES)}, teacher: <ckpt> (attention_"
                          f"transfer only)}}, got {obj}")
    if trainable not in TRAINABLE:
        raise ConfigError(f"stage.trainable must be one of {list(TRAINABLE)}, got {trainable!r}")
    return {"kind": kind, "teacher": obj.get("teacher")}


def check_same_shapes(other: dict, reference: dict, what: str) -> None:
    """One-line CheckpointError unless `other`'s layers (ModelConfig.to_dict()) have `reference`'s
    shapes: `what` names the other model (an attention-transfer teacher, a trained cell)."""
    differ = [k for k in TENSOR_FIELDS if other[k] != reference[k]]
    if differ:
        raise CheckpointError(f"{what} has other shapes than expected ("
                              + "; ".join(f"{k}: {other[k]} vs {reference[k]}" for k in differ) + ")")


def freeze_all_but_attention(model: nn.Module) -> int:
    """requires_grad=False on every parameter but the attention projections; returns how many
    parameters still train."""
    n = 0
    for name, p in model.named_parameters():
        p.requires_grad_(any(key in f".{name}" for key in ATTENTION_PARAMS))
        n += p.numel() if p.requires_grad else 0
    return n


@torch.no_grad()
def teacher_attention(teacher: nn.Module, input_ids: torch.Tensor) -> tuple[list, list]:
    """Per layer of `teacher`: the normalised hidden state its attention reads, and what that
    attention outputs (before the residual add), from one cache-free forward."""
    x = teacher.embed(input_ids)
    cos, sin = teacher.rope(input_ids.shape[1], input_ids.device)
    inputs, outputs = [], []
    for block in teacher.blocks:
        h = block.attn_norm(x)
        a = block.attn(h, cos, sin)
        inputs.append(h)
        outputs.append(a)
        x = x + a
        x = x + block.ffn(block.ffn_norm(x))
    return inputs, outputs


def attention_transfer_loss(student: nn.Module, teacher: nn.Module, input_ids: torch.Tensor,
                            eps: float = 1e-8) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean over layers of the relative squared error, the per-layer errors detached [n_layers]).
    The student's attention of layer l runs on the teacher's layer-l input, so layers are trained
    independently of one another (no error compounds through the depth)."""
    inputs, targets = teacher_attention(teacher, input_ids)
    cos, sin = student.rope(input_ids.shape[1], input_ids.device)
    per_layer = []
    for block, h, target in zip(student.blocks, inputs, targets):
        out = block.attn(h, cos, sin)
        target = target.float()
        per_layer.append((out.float() - target).pow(2).mean() / target.pow(2).mean().clamp_min(eps))
    errors = torch.stack(per_layer)
    return errors.mean(), errors.detach()
