"""The query-blocked eager kernel (scripts/peers/query_blocked_eager.py) that gives kvpress's
ObservedAttention its weights at 16K: the same output and weights as transformers' eager kernel."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from transformers import AttentionInterface, DynamicCache, LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parents[1]

spec = importlib.util.spec_from_file_location("query_blocked_eager", ROOT / "scripts/peers/query_blocked_eager.py")
kernel_module = importlib.util.module_from_spec(spec)
sys.modules.setdefault("query_blocked_eager", kernel_module)
spec.loader.exec_module(kernel_module)


@pytest.fixture
def tiny_gqa_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval()


def run(model, implementation, ids, split):
    """Logits and per-layer attention weights of a prefill of ids[:split] and a cached forward of the rest."""
    model.set_attn_implementation(implementation)
    cache = DynamicCache()
    with torch.no_grad():
        first = model(ids[:, :split], past_key_values=cache, output_attentions=True)
        rest = model(ids[:, split:], past_key_values=cache, output_attentions=True)
    return first, rest


@pytest.mark.parametrize("block_bytes", [4 * 6 * 7 * 40, 1 << 28])  # blocks of 7 query rows, or all rows at once
def test_blocked_kernel_gives_eager_outputs_and_weights_with_a_cache_and_grouped_heads(tiny_gqa_llama, monkeypatch,
                                                                                       block_bytes):
    monkeypatch.setattr(kernel_module, "BLOCK_BYTES", block_bytes)
    AttentionInterface.register(kernel_module.NAME, kernel_module.make_kernel(reuse_weights=False))
    ids = torch.randint(0, 100, (1, 40), generator=torch.Generator().manual_seed(1))
    eager = run(tiny_gqa_llama, "eager", ids, 30)
    blocked = run(tiny_gqa_llama, kernel_module.NAME, ids, 30)
    for want, got in zip(eager, blocked):
        torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=1e-6)
        assert len(got.attentions) == 2
        for w_want, w_got in zip(want.attentions, got.attentions):
            assert w_got.shape == w_want.shape
            torch.testing.assert_close(w_got, w_want, rtol=0, atol=1e-6)
            assert (w_got[0, :, :-1, -1] == 0).all()  # no row but the last sees the last key
    # the later forward's 10 queries see the 30 cached keys and their own causal prefix
    assert (blocked[1].attentions[0][0, :, 0, 31:] == 0).all() and (blocked[1].attentions[0][0, :, 0, :31] > 0).all()


def test_reused_weights_are_valid_only_until_the_next_call(tiny_gqa_llama):
    """With reuse, a caller that keeps every layer's weights sees the last layer's in all of them:
    why the runner reuses only inside a forward hook that consumes each layer's weights at once."""
    AttentionInterface.register(kernel_module.NAME, kernel_module.make_kernel(reuse_weights=True))
    ids = torch.randint(0, 100, (1, 24), generator=torch.Generator().manual_seed(2))
    eager, _ = run(tiny_gqa_llama, "eager", ids, 23)
    blocked, last = run(tiny_gqa_llama, kernel_module.NAME, ids, 23)
    # the one-token forward after the prefill wrote its layers' weights over the buffer's first elements
    torch.testing.assert_close(blocked.attentions[0].flatten()[:6 * 24], last.attentions[1].flatten(), rtol=0, atol=0)
    torch.testing.assert_close(blocked.logits, eager.logits, rtol=0, atol=1e-6)
    assert blocked.attentions[0].data_ptr() == blocked.attentions[1].data_ptr() == last.attentions[0].data_ptr()


def test_blocked_kernel_refuses_a_padding_mask():
    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match="causal only"):
        kernel_module.query_blocked_eager(None, q, q, q, torch.zeros(1, 1, 3, 3), 0.5)
