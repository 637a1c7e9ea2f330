"""A `transformers` Llama -> our Standard model: the config it maps to, or a one-line refusal naming
the field our Standard cannot represent exactly.

Our Standard is a Llama (anchormass/hf/export_llama.py): pre-RMSNorm blocks, SwiGLU, rotate-half
RoPE, no biases, grouped-query attention in `repeat_kv` order, optionally a tied LM head. What a
Llama config may say beyond that (biases, a sliding window, RoPE scaling, another activation, a
pre-quantised checkpoint) would make our model compute something else, so it is refused before any
weight is read. Dynamic NTK (docs/method.md §1) starts only beyond `original_max_len`, set to the
source's trained context, so up to that length our RoPE is the source's plain RoPE.
"""

from __future__ import annotations

import numpy as np
import torch

from anchormass.errors import ConfigError
from anchormass.models.config import ModelConfig, read_preset

LLAMA_CLASS = "LlamaForCausalLM"
# Refused when truthy, with what the field means: each changes the function our Standard computes.
_REFUSED_WHEN_SET = {
    "attention_bias": "biases on the attention projections",
    "mlp_bias": "biases in the MLP",
    "sliding_window": "sliding-window attention",
    "quantization_config": "a pre-quantised checkpoint",
}


def refusal(hf_config) -> str | None:
    """Why our Standard cannot represent `hf_config` exactly (naming the field), or None."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type != "llama":
        return f"model_type={model_type!r}: only Llama-architecture models are imported"
    architectures = getattr(hf_config, "architectures", None) or [LLAMA_CLASS]
    if architectures != [LLAMA_CLASS]:
        return f"architectures={architectures}: only {LLAMA_CLASS} is imported"
    for field, what in _REFUSED_WHEN_SET.items():
        value = getattr(hf_config, field, None)
        if value:
            return f"{field}={value!r} ({what}): our Standard has none"
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default":
        return f"rope_parameters.rope_type={rope['rope_type']!r}: only plain RoPE (rope_type 'default') is imported"
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        return f"rope_parameters.partial_rotary_factor={rope['partial_rotary_factor']}: RoPE on every dimension only"
    if hf_config.hidden_act != "silu":
        return f"hidden_act={hf_config.hidden_act!r}: our MLP is SwiGLU (silu)"
    head_dim = _head_dim(hf_config)
    if head_dim * hf_config.num_attention_heads != hf_config.hidden_size:
        return (f"head_dim={head_dim}: num_attention_heads * head_dim must equal hidden_size "
                f"({hf_config.num_attention_heads} * {head_dim} != {hf_config.hidden_size})")
    return None


def check_representable(hf_config, src) -> None:
    why = refusal(hf_config)
    if why is not None:
        raise ConfigError(f"src={src}: {why}; refusing to import")


def _head_dim(hf_config) -> int:
    return getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads


def _as_written(value: float) -> float:
    """A float32 value (GGUF stores its numbers as float32: 1e-5 reads 9.999999747e-06) as the shortest
    decimal that rounds to it, so the config reads as the model was published; others unchanged."""
    as_f32 = np.float32(value)
    return float(str(as_f32)) if float(as_f32) == value else float(value)


def default_global_groups(n_kv: int) -> int:
    """KV groups that are global when nothing is chosen: the last third, at least one (SmolLM2's 3
    groups: 1 global = 3 query heads, 2 local = 6, the anchormass_smollm2_135m split)."""
    return max(1, n_kv // 3)


def our_config(hf_config, name: str, n_global_groups: int | None = None) -> ModelConfig:
    """The Standard ModelConfig of `hf_config` (already checked); every field the source does not set
    comes from configs/model/base.yaml. `n_global_groups`: the AnchorMass split this checkpoint carries
    (whole KV groups, the last ones global), for a later `init_across_arch` start."""
    n_heads = hf_config.num_attention_heads
    n_kv = hf_config.num_key_value_heads or n_heads
    groups = default_global_groups(n_kv) if n_global_groups is None else n_global_groups
    n_global = groups * (n_heads // n_kv)
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    return ModelConfig.from_dict({
        **read_preset("base"), "name": name, "arch": "standard",
        "vocab_size": hf_config.vocab_size, "n_layers": hf_config.num_hidden_layers,
        "d_model": hf_config.hidden_size, "n_heads": n_heads, "n_kv_heads": None if n_kv == n_heads else n_kv,
        "head_dim": _head_dim(hf_config), "ffn_dim": hf_config.intermediate_size,
        "norm_eps": _as_written(hf_config.rms_norm_eps), "init_std": float(hf_config.initializer_range),
        "tie_embeddings": bool(hf_config.tie_word_embeddings),
        "rope_theta": float(rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))),
        "original_max_len": int(hf_config.max_position_embeddings),
        "n_local_heads": n_heads - n_global, "n_global_heads": n_global,
    })


def our_state_dict(llama_state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """LlamaForCausalLM's state dict -> our model's names (fp32 copies, contiguous)."""
    from anchormass.hf.export_llama import ours_from_llama_state_dict

    state = ours_from_llama_state_dict(llama_state, cfg.n_layers)
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in state.items()}
