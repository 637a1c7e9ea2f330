"""Standard checkpoint -> a native `LlamaForCausalLM` folder (config.json + model.safetensors).

Our Standard model is a Llama: pre-RMSNorm blocks, SwiGLU (w1 = gate, w3 = up, w2 = down),
no biases; its LM head tied or not (`tie_embeddings` -> `tie_word_embeddings`) and its KV heads
(`n_kv_heads` -> `num_key_value_heads`; query head h reads KV head h // (n_heads / n_kv_heads),
which is Llama's `repeat_kv` order). RoPE needs no permutation: we already use
the rotate-half layout (dimension i paired with i + D/2, frequency theta^(-2i/D)) that
`transformers`' Llama applies, so q_proj / k_proj rows are copied as they are.

Dynamic NTK (docs/method.md §1): we fix the RoPE base once per session from the prompt length
P, theta * (P / L)^(D / (D - 2)) when P > L = original_max_len, and keep it for every decoded
token. `transformers`' `rope_type="dynamic"` with factor 1 evaluates the same formula, but from
the longest position of each forward and remembered across calls: one fresh forward over P
tokens matches ours, while generation beyond L re-bases every new token (cached keys keep the
old base) and a later, shorter forward can keep a longer call's base. Neither matches a fixed
session base, so the export uses plain RoPE (`rope_type="default"`), exact up to L; the folder
records L as `max_position_embeddings`. Beyond L use this package (or the AnchorMass export), or
export for one prompt length P (`session_len=P`): plain RoPE whose theta is our session base at P,
which is our model exactly for every prompt of P tokens and the tokens decoded after it (the
equal-bytes comparison's prompts all have one length, so kvpress can run there; kv_frontier).
"""

from __future__ import annotations

import torch

from anchormass.models.rope import ntk_base

# our parameter name (inside block i) -> Llama's
_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.o_proj.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn.w1.weight": "mlp.gate_proj.weight",
    "ffn.w3.weight": "mlp.up_proj.weight",
    "ffn.w2.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
              "lm_head.weight": "lm_head.weight"}


def llama_state_dict(state: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """Our model's state dict -> LlamaForCausalLM's names (the same tensors, renamed)."""
    out = {}
    for name, tensor in state.items():
        if name in _TOP_NAMES:
            out[_TOP_NAMES[name]] = tensor
            continue
        prefix, _, rest = name.partition(".")
        idx, _, param = rest.partition(".")
        if prefix != "blocks" or not idx.isdigit() or int(idx) >= n_layers or param not in _BLOCK_NAMES:
            raise KeyError(f"no Llama counterpart for parameter '{name}'")
        out[f"model.layers.{idx}.{_BLOCK_NAMES[param]}"] = tensor
    return out


def ours_from_llama_state_dict(state: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    """LlamaForCausalLM's state dict -> our names: `llama_state_dict` read backwards."""
    to_ours = {llama: ours for ours, llama in _TOP_NAMES.items()}
    to_ours.update({f"model.layers.{i}.{llama}": f"blocks.{i}.{ours}"
                    for i in range(n_layers) for ours, llama in _BLOCK_NAMES.items()})
    unknown = sorted(set(state) - set(to_ours))
    if unknown:
        raise KeyError(f"no counterpart in our model for Llama parameter(s) {unknown[:3]}")
    return {to_ours[name]: tensor for name, tensor in state.items()}


def past_trained_length(cfg, session_len: int | None) -> bool:
    """Do prompts of `session_len` tokens run under NTK-scaled RoPE (a base of their own)?"""
    return session_len is not None and session_len > cfg.original_max_len


def llama_config(cfg, special_ids: dict[str, int], session_len: int | None = None):
    """A `LlamaConfig` describing the same network as our ModelConfig `cfg` (arch standard); with
    `session_len`, the network our sessions run for prompts of that many tokens (module docstring)."""
    from transformers import LlamaConfig

    theta, max_len = float(cfg.rope_theta), cfg.original_max_len
    if past_trained_length(cfg, session_len):
        theta, max_len = ntk_base(cfg.rope_theta, session_len, cfg.original_max_len, cfg.head_dim), session_len

    return LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn_dim,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim, hidden_act="silu", max_position_embeddings=max_len,
        rms_norm_eps=cfg.norm_eps, rope_parameters={"rope_type": "default", "rope_theta": theta},
        attention_bias=False, mlp_bias=False, tie_word_embeddings=cfg.tie_embeddings, initializer_range=cfg.init_std,
        bos_token_id=special_ids["bos"], eos_token_id=special_ids["eos"], pad_token_id=special_ids["pad"],
        torch_dtype="float32",
    )


def llama_from_ours(model, special_ids: dict[str, int], session_len: int | None = None):
    """A LlamaForCausalLM holding a copy of `model`'s (our Standard LanguageModel) weights in fp32
    (`session_len`: see llama_config)."""
    from transformers import LlamaForCausalLM

    cfg = model.cfg
    if cfg.arch != "standard":
        raise ValueError(f"only Standard models map onto Llama, got arch {cfg.arch!r}")
    hf = LlamaForCausalLM(llama_config(cfg, special_ids, session_len)).to(model.lm_head.weight.device)
    state = llama_state_dict({k: v.detach().float() for k, v in model.state_dict().items()}, cfg.n_layers)
    hf.load_state_dict(state, strict=True)
    for key in ("bos", "eos", "pad"):
        setattr(hf.generation_config, f"{key}_token_id", special_ids[key])
    return hf.eval()


def export_llama(model, out_dir, special_ids: dict[str, int], session_len: int | None = None) -> None:
    """Write `model` (our Standard LanguageModel) into `out_dir` as a LlamaForCausalLM folder."""
    llama_from_ours(model, special_ids, session_len).save_pretrained(str(out_dir), safe_serialization=True)
