"""Grouped-query attention and tied embeddings (docs/method.md §1): the config fields, the model's
shapes and parameter count, the defaults that leave every existing model as it was."""

import pytest
import torch
from _gqa_helpers import gqa_config

from anchormass.errors import ConfigError
from anchormass.models import build_model
from anchormass.models.accounting import count_parameters, kv_bytes_per_token, kv_bytes_session, param_count
from anchormass.models.attention_base import repeat_kv
from anchormass.models.config import ModelConfig, load_model_config
from anchormass.models.reference import reference_anchormass_attention


def test_defaults_leave_the_model_as_it_was():
    cfg = load_model_config("base")
    assert cfg.n_kv_heads is None and cfg.kv_heads == cfg.n_heads and cfg.q_per_kv == 1
    assert cfg.tie_embeddings is False
    # a checkpoint written before the fields existed lacks them: it loads as the same model
    old = {k: v for k, v in cfg.to_dict().items() if k not in ("n_kv_heads", "tie_embeddings")}
    assert ModelConfig.from_dict(old) == cfg
    assert cfg.replace(n_kv_heads=12) == cfg  # as many KV as query heads is spelled null


@pytest.mark.parametrize("changes, fragment", [
    (dict(n_kv_heads=3), "must be positive and divide n_heads"),
    (dict(n_kv_heads=0), "must be positive and divide n_heads"),
    (dict(n_kv_heads=2.0), "n_kv_heads must be an integer"),
    (dict(tie_embeddings="yes"), "tie_embeddings must be true or false"),
    (dict(n_kv_heads=2, n_local_heads=1, n_global_heads=3), "whole KV groups"),
])
def test_bad_gqa_fields_are_one_line_errors(changes, fragment):
    base = load_model_config("anchormass_tiny").to_dict()
    with pytest.raises(ConfigError, match=fragment):
        ModelConfig.from_dict({**base, **changes})


@pytest.mark.parametrize("arch", ["standard", "anchormass"])
def test_gqa_tied_model_shapes_count_and_forward(arch):
    cfg = gqa_config(arch)
    torch.manual_seed(0)
    model = build_model(cfg)
    attn = model.blocks[0].attn
    assert attn.q_proj.weight.shape == (8 * 16, 128) and attn.k_proj.weight.shape == (4 * 16, 128)
    assert model.lm_head.weight is model.embed.weight  # one parameter ...
    assert count_parameters(model) == param_count(cfg)  # ... counted once
    assert param_count(cfg) == param_count(cfg.replace(tie_embeddings=False)) - 1000 * 128
    # the state dict keeps both names, so a tied and an untied model have the same keys
    assert set(model.state_dict()) == set(build_model(cfg.replace(tie_embeddings=False)).state_dict())
    logits = model(torch.randint(0, 1000, (2, 90)))
    assert logits.shape == (2, 90, 1000) and torch.isfinite(logits).all()


def test_a_smollm2_135m_shape_counts_as_the_published_model():
    """Llama shape of SmolLM2-135M: 30 layers, d 576, 9 query / 3 KV heads of 64, MLP 1536, vocab
    49152, tied: 134,515,008 parameters, built and analytic."""
    cfg = load_model_config("standard_tiny").replace(
        vocab_size=49152, n_layers=30, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, ffn_dim=1536,
        tie_embeddings=True, rope_theta=100000.0, n_local_heads=3, n_global_heads=6)
    with torch.device("meta"):
        model = build_model(cfg)
    assert count_parameters(model) == param_count(cfg) == 134_515_008
    assert param_count(cfg.replace(arch="anchormass")) == 134_515_008  # twin: 3 local + 6 global heads


def test_kv_bytes_count_kv_heads():
    std = gqa_config("standard")
    assert kv_bytes_session(std, 500) * 2 == kv_bytes_session(std.replace(n_kv_heads=None), 500)
    am = gqa_config("anchormass")  # K/V halve; the slots' fp32 masses (one per slot, not per head) stay
    slots = 7 * am.slots_per_block  # 500 = 16 sinks + 7 blocks of 64 + a tail of 36
    assert 2 * kv_bytes_session(am, 500) - kv_bytes_session(am.replace(n_kv_heads=None), 500) == 2 * slots * 4
    assert kv_bytes_per_token(gqa_config("standard")) == 2 * 2 * 4 * 16 * 2  # K+V, 2 layers, 4 KV heads, bf16


def test_reference_shares_each_kv_head_with_its_query_group():
    """The oracle with 4 KV heads == the oracle with each KV head copied to its 2 query heads."""
    cfg = gqa_config("anchormass", block_size=16, group_size=4, n_sinks=5, window=8)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 70, 16, generator=g)
    k, v = (torch.randn(2, 4, 70, 16, generator=g) for _ in range(2))
    got = reference_anchormass_attention(q, k, v, cfg)
    # copies have identical values, so stage 1's per-group decisions are the same as on the KV heads
    want = reference_anchormass_attention(q, repeat_kv(k, 2), repeat_kv(v, 2), cfg.replace(n_kv_heads=None))
    assert (got - want).abs().max().item() <= 1e-6


def test_retrofit_slot_probe_reads_query_heads_of_a_gqa_model():
    """The probe's per-query attention (weights over sinks, slots and tail) reproduces the model's
    global heads under GQA: k, v reach it copied to the query heads they serve."""
    from anchormass.eval.suites.retrofit.slot_probe import LayerView, probe_forward

    cfg = gqa_config("anchormass", block_size=16, group_size=4, n_sinks=3, window=8)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    ids = torch.randint(0, 1000, (1, 70))
    _, layers = probe_forward(model, ids, [69])
    qkv = layers[1]
    assert qkv.k.shape[1] == cfg.n_heads
    kv = qkv.k[:, ::2], qkv.v[:, ::2]  # the KV heads themselves (copies sit in consecutive pairs)
    want = reference_anchormass_attention(qkv.q, *kv, cfg)[0, cfg.n_local_heads:, 69]  # [Hg, D]
    weights, vals, _ = LayerView(cfg, qkv).attention(0, 69)
    assert ((weights[..., None] * vals.double()).sum(1) - want.double()).abs().max().item() <= 1e-5


def test_a_checkpoint_written_before_the_fields_loads_unchanged(tmp_path):
    # (most of its time is importing the training stack, which the whole suite imports anyway)
    from anchormass.training.checkpoint import atomic_torch_save, load_model

    torch.manual_seed(0)
    model = build_model("anchormass_tiny").eval()
    old_config = {k: v for k, v in model.cfg.to_dict().items() if k not in ("n_kv_heads", "tie_embeddings")}
    path = tmp_path / "old.ckpt"
    atomic_torch_save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
                       "hyper_parameters": {"model_config": old_config}}, path)
    loaded, _ = load_model(path)
    assert loaded.cfg == model.cfg and loaded.lm_head.weight is not loaded.embed.weight
    ids = torch.randint(0, model.cfg.vocab_size, (1, 40))
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))
