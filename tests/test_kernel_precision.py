"""bf16 inputs: block-wise SDPA adds log(mass) in fp32, as FlexAttention's score_mod does."""

import torch
import torch.nn.functional as F

from anchormass.models.config import load_model_config
from anchormass.models.kernels import block_sdpa
from anchormass.models.kernels.layout import global_slots

# Many blocks and groups of 4: slot masses 1..4 (log 3 is not a bf16 number).
CFG = load_model_config("anchormass_tiny").replace(n_local_heads=0, n_global_heads=4, block_size=16,
                                                   group_size=4, n_sinks=5, window=8)


def _bf16_qkv(seed, t=203):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 4, t, 32, generator=g).bfloat16() for _ in range(3))


def _fp64_reference(q, k, v, monkeypatch):
    """The same attention in fp64 over the slots the bf16 kernel forms, so only the attention's own
    arithmetic (not stage 1's bf16 averages) separates kernel and reference."""
    n_sink, slot_k, slot_v, slot_lm = global_slots(k, v, CFG)
    with monkeypatch.context() as m:
        m.setattr(block_sdpa, "global_slots", lambda *_: (n_sink, slot_k.double(), slot_v.double(), slot_lm))
        return block_sdpa.global_attention(q.double(), k.double(), v.double(), CFG, chunk=48)


def test_bf16_output_is_the_rounded_fp64_result(monkeypatch):
    # fp32 scores + fp32 bias + fp32 softmax, rounded once at the end: the bf16 output is the
    # correctly rounded fp64 result except where fp32 noise meets a rounding tie. Computing in bf16
    # (and rounding the log-mass bias to bf16) misrounds a large fraction of the outputs instead.
    for seed in (0, 1):
        q, k, v = _bf16_qkv(seed)
        want = _fp64_reference(q, k, v, monkeypatch)
        got = block_sdpa.global_attention(q, k, v, CFG, chunk=48)
        assert got.dtype == torch.bfloat16
        misrounded = (got != want.bfloat16()).float().mean().item()
        assert misrounded < 0.01, misrounded
        assert (got.double() - want).abs().max().item() <= 2**-8 * want.abs().max().item()


def test_log_mass_reaches_sdpa_unrounded(monkeypatch):
    """The additive mask SDPA receives for bf16 inputs, with and without autocast, is fp32 and holds
    log(mass) exactly."""
    q, k, v = _bf16_qkv(2, t=90)
    slot_lm = global_slots(k, v, CFG)[3]
    seen = []
    real = F.scaled_dot_product_attention

    def spy(q_, k_, v_, attn_mask=None, **kw):
        seen.append(attn_mask)
        return real(q_, k_, v_, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(block_sdpa.F, "scaled_dot_product_attention", spy)
    for autocast in (False, True):
        seen.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            block_sdpa.global_attention(q, k, v, CFG, chunk=48)
        assert seen and all(m.dtype == torch.float32 for m in seen)
        last = seen[-1][:, 0, -1]  # the last query sees every slot: [B, Kn]
        n_sink = CFG.n_sinks
        got = last[:, n_sink:n_sink + slot_lm.shape[1]]
        assert torch.equal(got, slot_lm.float())


def test_the_cache_adds_log_mass_in_fp32_in_bf16(monkeypatch):
    """Chunked prefill and decode through the AnchorMass cache in bf16: every SDPA call whose mask
    carries log(mass) (finite non-zero entries) gets it in fp32, as the parallel kernels do."""
    from anchormass.cache import new_cache
    from anchormass.inference.generate import prefill
    from anchormass.models import build_model

    torch.manual_seed(0)
    model = build_model("anchormass_tiny").to(torch.bfloat16).eval()
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        if attn_mask is not None and attn_mask.is_floating_point():
            finite = attn_mask[torch.isfinite(attn_mask)]
            if (finite != 0).any():
                seen.append(attn_mask.dtype)
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    ids = torch.randint(0, model.cfg.vocab_size, (1, 300))
    cache = new_cache(model, batch_size=1, budget=8)
    with torch.no_grad():
        logits = prefill(model, ids, cache, chunk_size=100)
        model(logits.argmax(-1, keepdim=True), cache=cache)
    assert seen and all(dt == torch.float32 for dt in seen), seen
