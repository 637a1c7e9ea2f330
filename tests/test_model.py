"""The model: exact sizes, build_model inputs, causality, the cache hook and RoPE session base, accounting."""

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from anchormass.cache.base import KVCache, LayerCache
from anchormass.errors import ConfigError, DataError
from anchormass.models import build_model
from anchormass.models.accounting import (
    count_parameters,
    estimate_flops_per_token,
    kv_bytes_per_token,
    kv_bytes_session,
    param_count,
)
from anchormass.models.config import load_model_config
from anchormass.models.rope import ntk_base

SIZE_158M = 158_635_776


@pytest.mark.parametrize("name", ["standard_158m", "anchormass_158m"])
def test_exact_parameter_count(name):
    with torch.device("meta"):
        model = build_model(name)
    assert count_parameters(model) == param_count(model.cfg) == SIZE_158M


@pytest.mark.parametrize("name", ["standard_mini", "anchormass_tiny"])
def test_analytic_count_matches_other_sizes(name):
    with torch.device("meta"):
        model = build_model(name)
    assert count_parameters(model) == param_count(model.cfg)


def test_both_architectures_have_identical_parameters_and_no_biases_or_buffers():
    a, s = build_model("anchormass_tiny"), build_model("standard_tiny")
    shapes = lambda m: {k: tuple(v.shape) for k, v in m.state_dict().items()}  # noqa: E731
    assert shapes(a) == shapes(s)
    assert set(a.state_dict()) == {n for n, _ in a.named_parameters()}  # no buffers, no caches
    assert not any("bias" in n for n in a.state_dict())
    assert a.lm_head.weight.data_ptr() != a.embed.weight.data_ptr()  # untied


def test_build_model_accepts_every_spec():
    cfg = load_model_config("anchormass_tiny")
    for spec in ("anchormass_tiny", cfg, cfg.to_dict(), OmegaConf.create(cfg.to_dict())):
        assert build_model(spec).cfg == cfg
    with pytest.raises(ConfigError):
        build_model({**cfg.to_dict(), "n_local_heads": 1})


@pytest.mark.parametrize("name", ["standard_tiny", "anchormass_tiny"])
def test_forward_is_causal_and_hidden_matches_logits(name):
    torch.manual_seed(0)
    model = build_model(load_model_config(name).replace(vocab_size=1000)).eval()
    ids = torch.randint(0, model.cfg.vocab_size, (2, 150))
    with torch.no_grad():
        logits = model(ids)
        assert logits.shape == (2, 150, model.cfg.vocab_size) and torch.isfinite(logits).all()
        assert torch.allclose(model.lm_head(model.forward_hidden(ids)), logits)
        changed = ids.clone()
        changed[:, 100:] = (changed[:, 100:] + 1) % model.cfg.vocab_size
        # The NTK base depends on T only, and T <= original_max_len here, so prefixes must agree.
        assert (model(changed)[:, :100] - logits[:, :100]).abs().max() <= 1e-5


def test_out_of_range_ids_are_rejected():
    model = build_model("anchormass_tiny")
    with pytest.raises(DataError, match="outside the vocabulary"):
        model(torch.tensor([[1, 28_000]]))
    with pytest.raises(DataError):
        model(torch.tensor([1, 2]))


@pytest.mark.parametrize("name", ["standard_tiny", "anchormass_tiny"])
def test_runs_under_bf16_autocast_and_trains(name):
    model = build_model(name)
    ids = torch.randint(0, 28_000, (1, 90))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids)
    loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), ids.view(-1))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


class _DenseLayer(LayerCache):
    """A throwaway full-attention cache (test fake): exercises the model's cache hook only."""

    def __init__(self):
        self.k = self.v = None

    def attend(self, q, k, v):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        t, n = q.shape[2], self.k.shape[2]
        visible = torch.arange(n)[None, :] <= torch.arange(n - t, n)[:, None]
        return F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=visible)


@pytest.mark.parametrize("prompt", [40, 90])  # 90 > original_max_len: NTK-scaled session base
def test_cache_hook_positions_and_fixed_session_base(prompt):
    torch.manual_seed(1)
    model = build_model(load_model_config("standard_tiny").replace(original_max_len=64)).eval()
    ids = torch.randint(0, 28_000, (2, prompt + 5))
    cache = KVCache([_DenseLayer() for _ in model.blocks], batch_size=2)
    cache.rope_base = ntk_base(model.cfg.rope_theta, prompt, 64, model.cfg.head_dim)  # as prefill sets it
    with torch.no_grad():
        parts = [model(ids[:, :17], cache=cache), model(ids[:, 17:prompt], cache=cache)]
        parts += [model(ids[:, t:t + 1], cache=cache) for t in range(prompt, prompt + 5)]
        incremental = torch.cat(parts, dim=1)
        # The session keeps the prompt's base while decoding past it; the parallel path over the
        # prompt alone uses the same base, so the prompt positions must agree exactly.
        parallel = model(ids[:, :prompt])
    assert cache.seen_tokens == prompt + 5
    assert cache.rope_base == ntk_base(model.cfg.rope_theta, prompt, 64, model.cfg.head_dim)
    assert (incremental[:, :prompt] - parallel).abs().max() <= 1e-4
    if prompt <= 64:  # unscaled base: the decoded tokens match the parallel path too
        assert (incremental - model(ids)).abs().max() <= 1e-4


def test_bare_cache_forward_sets_base_from_first_chunk():
    model = build_model(load_model_config("standard_tiny").replace(original_max_len=16)).eval()
    cache = KVCache([_DenseLayer() for _ in model.blocks], batch_size=1)
    with torch.no_grad():
        model(torch.randint(0, 28_000, (1, 48)), cache=cache)
        base = cache.rope_base
        model(torch.randint(0, 28_000, (1, 1)), cache=cache)
    assert base == ntk_base(model.cfg.rope_theta, 48, 16, model.cfg.head_dim) > model.cfg.rope_theta
    assert cache.rope_base == base


def test_kv_accounting():
    std, am = load_model_config("standard_158m"), load_model_config("anchormass_158m")
    assert kv_bytes_per_token(std) == 2 * 14 * 12 * 64 * 2
    assert kv_bytes_session(std, 262_144) == 10_752 * 2**20  # the write-up's 10,752 MiB
    assert kv_bytes_session(std, 4096, budget=1024) == 1024 * kv_bytes_per_token(std)
    # AnchorMass: constant once the slot budget is full (same tail length at both lengths).
    assert kv_bytes_session(am, 2**17) == kv_bytes_session(am, 2**18) < 200 * 2**20
    assert kv_bytes_session(am, 2**15) < kv_bytes_session(am, 2**17)
    # Hand count at 100 tokens: 64 local + 16 sinks + 16 slots (1 block) + 20 tail, bf16, fp32 mass.
    per_tok = 2 * 6 * 64 * 2
    assert kv_bytes_session(am, 100) == 14 * (64 * per_tok + 16 * per_tok + 16 * (per_tok + 4) + 20 * per_tok)


def test_flops_estimate():
    std, am = load_model_config("standard_158m"), load_model_config("anchormass_158m")
    matmul = 14 * (4 * 768**2 + 3 * 768 * 2560) + 28_000 * 768
    assert estimate_flops_per_token(std, 1) == 6 * matmul + 12 * 14 * 64 * 12
    assert estimate_flops_per_token(am, 32_768) < 0.5 * estimate_flops_per_token(std, 32_768)


def test_activation_checkpointing_gives_the_same_gradients():
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(3)
        model = build_model(load_model_config("anchormass_tiny").replace(activation_checkpointing=ckpt,
                                                                         vocab_size=1000))
        ids = torch.randint(0, 1000, (1, 100))
        model.forward_hidden(ids).pow(2).mean().backward()
        grads.append([p.grad for n, p in model.named_parameters() if not n.startswith("lm_head")])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6)
    with pytest.raises(ConfigError, match="activation_checkpointing"):
        load_model_config("anchormass_tiny").replace(activation_checkpointing="yes")


@pytest.mark.parametrize("field, value", [("window", "x"), ("n_layers", 2.5), ("slot_budget", None),
                                          ("outlier_cos", "a"), ("outliers", 1), ("n_layers", True)])
def test_config_rejects_wrongly_typed_fields_in_one_line(field, value):
    with pytest.raises(ConfigError, match=f"{field} must be"):
        load_model_config("anchormass_tiny").replace(**{field: value})
    assert load_model_config("anchormass_tiny").replace(rope_theta=10_000).rope_theta == 10_000  # int for float
