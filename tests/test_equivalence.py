"""THE invariant (docs/method.md §2.5): parallel logits == chunked prefill + token-by-token decode (fp32, <= 1e-4).

Both models, random init. The budget is large enough that stage 2 never fires. Both again with
grouped-query attention and tied embeddings (tests/_gqa_helpers.py), and AnchorMass with a learned
outlier scorer (outlier_scorer=learned) drawn at random, so its choices differ from the zero init's.
"""

import pytest
import torch
from _gqa_helpers import gqa_config

from anchormass.cache import new_cache
from anchormass.models import build_model, load_model_config

TOL = 1e-4
MODELS = {}


def model(name):
    if name not in MODELS:
        torch.manual_seed(0)
        # anchormass_tiny_g1: the ablations' lossless_slots (group_size 1: one slot per token)
        spec = load_model_config("anchormass_tiny").replace(group_size=1) if name == "anchormass_tiny_g1" else name
        if name.endswith("_gqa"):
            spec = gqa_config(name.removesuffix("_tiny_gqa"))
        if name.endswith("_learned"):
            spec = load_model_config(name.removesuffix("_learned")).replace(outlier_scorer="learned")
        MODELS[name] = build_model(spec).eval()
        for block in MODELS[name].blocks if name.endswith("_learned") else []:
            torch.nn.init.normal_(block.attn.outlier_score, 0.0, 1.0)
    return MODELS[name]


def incremental_logits(m, ids, chunk, prompt_len):
    """Prefill ids[:, :prompt_len] in chunks of `chunk`, then decode the rest one token at a time."""
    budget = 4096 if m.cfg.arch == "anchormass" else None  # Standard: policy None = full cache
    cache = new_cache(m, batch_size=ids.shape[0], budget=budget)
    out = [m(ids[:, s:min(s + chunk, prompt_len)], cache=cache) for s in range(0, prompt_len, chunk)]
    out += [m(ids[:, t:t + 1], cache=cache) for t in range(prompt_len, ids.shape[1])]
    assert cache.seen_tokens == ids.shape[1]
    return torch.cat(out, dim=1), cache


# Lengths below the sink count, not multiples of 64, several blocks; each chunk size (1, 7, 64,
# larger than the prompt) meets short and long prompts. The full cross product costs ~2x the time.
CASES = [(5, 1), (5, 7), (15, 7), (15, 1000), (100, 1), (100, 64), (200, 7), (200, 1000), (333, 64), (333, 1000)]
NAMES = ("anchormass_tiny", "standard_tiny", "anchormass_tiny_g1", "anchormass_tiny_gqa", "standard_tiny_gqa")
ALL_CASES = [(name, t, c) for name in NAMES for t, c in CASES]
# The learned scorer acts once a block is compressed: from S + C = 80 tokens on.
ALL_CASES += [("anchormass_tiny_learned", t, c) for t, c in CASES if t >= 100]


@pytest.mark.parametrize("name, t, chunk", ALL_CASES, ids=[f"{n}-T{t}-chunk{c}" for n, t, c in ALL_CASES])
@torch.no_grad()
def test_parallel_equals_incremental(name, t, chunk):
    m = model(name)
    g = torch.Generator().manual_seed(t)
    ids = torch.randint(0, m.cfg.vocab_size, (2, t), generator=g)
    want = m(ids)  # [2, T, V]
    prompt = max(1, (2 * t) // 3)  # the last third decodes token by token
    got, cache = incremental_logits(m, ids, chunk, prompt)
    diff = (got - want).abs().max().item()
    print(f"{name} T={t} chunk={chunk}: max |parallel - incremental| = {diff:.2e}")
    assert diff <= TOL
    st = cache.stats()
    assert st["tokens"] == t
    assert st["mass"] == [[t, t]] * m.cfg.n_layers  # nothing merged or evicted: every token counted once


@pytest.mark.parametrize("name", ["anchormass_tiny", "standard_tiny", "anchormass_tiny_gqa"])
@torch.no_grad()
def test_batch_elements_do_not_influence_each_other(name):
    m = model(name)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, m.cfg.vocab_size, (2, 150), generator=g)
    other = ids.clone()
    other[1] = torch.randint(0, m.cfg.vocab_size, (150,), generator=g)
    a, _ = incremental_logits(m, ids, 64, 100)
    b, _ = incremental_logits(m, other, 64, 100)
    assert (a[0] - b[0]).abs().max().item() <= 1e-6  # sequence 0 unchanged
    assert (a[1] - b[1]).abs().max().item() > 1e-2  # the change did reach sequence 1
    single, _ = incremental_logits(m, ids[:1], 64, 100)  # and batch 1 gives the same numbers
    assert (single[0] - a[0]).abs().max().item() <= TOL
