"""One prefill shared by the full cache and every KV policy gives each of them exactly what its own
session gives: the same greedy answers, the same stored bytes after every token (cache/shared_prefill.py)."""

import pytest
import torch
from _gqa_helpers import gqa_config

from anchormass.cache import new_cache
from anchormass.cache.kv_policies import H2O, SnapKV
from anchormass.cache.shared_prefill import SharedPrefill
from anchormass.errors import ConfigError
from anchormass.eval.scoring import session_decode, shared_session_decode
from anchormass.models import build_model

SETTINGS = [(None, None), (SnapKV(window=16), 24), (SnapKV(window=8), 12), ("h2o", 24), (H2O(recent=4), 10),
            ("streaming_llm", 16), ("streaming_llm", 40)]


@pytest.mark.parametrize("spec", ["standard_tiny", "gqa"])
def test_shared_prefill_equals_one_session_per_policy(spec):
    torch.manual_seed(0)
    model = build_model(gqa_config("standard") if spec == "gqa" else spec).eval()
    ids = torch.randint(0, model.cfg.vocab_size, (2, 48), generator=torch.Generator().manual_seed(3))
    shared = shared_session_decode(model, ids, 6, 64, SETTINGS)
    stored = set()
    for (policy, budget), (out, meter) in zip(SETTINGS, shared):
        alone, own = session_decode(model, ids, 6, 64, policy, budget)
        assert torch.equal(out, alone), (policy, budget)
        assert meter.as_dict() == own.as_dict(), (policy, budget)
        stored.add(meter.stored_end)
    assert len(stored) > 3  # the budgets really differ: a shared cache that leaked into another would show


def test_shared_prefill_refuses_what_it_cannot_share():
    model = build_model("standard_tiny").eval()
    ids = torch.zeros(1, 40, dtype=torch.long)
    with pytest.raises(ConfigError, match="one forward"):
        shared_session_decode(model, ids, 2, 16, SETTINGS[:2])  # chunks: a policy may evict between them
    used = new_cache(model, 1)
    with torch.no_grad():
        model(ids[:, :4], cache=used)
    with pytest.raises(ConfigError, match="fresh caches"):
        SharedPrefill([new_cache(model, 1), used])
    with pytest.raises(ConfigError, match="Standard caches"):
        SharedPrefill([])


def test_h2o_at_several_budgets_scores_the_prompt_once(monkeypatch):
    """Its scores depend on the keys and queries only, so the second and third budgets copy the first's:
    the fp32 attention of a long prompt is computed once per layer, and the answers stay each session's own."""
    import anchormass.cache.kv_policies.h2o as h2o

    calls = []
    real = h2o.attention_received
    monkeypatch.setattr(h2o, "attention_received", lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(0)
    model = build_model(gqa_config("standard")).eval()
    ids = torch.randint(0, model.cfg.vocab_size, (2, 48), generator=torch.Generator().manual_seed(3))
    settings = [(None, None), ("h2o", 24), (H2O(recent=4), 10), ("h2o", 16)]
    shared = shared_session_decode(model, ids, 1, 64, settings)
    assert len(calls) == model.cfg.n_layers  # one query block per layer for three H2O caches
    for (policy, budget), (out, meter) in zip(settings, shared):
        alone, own = session_decode(model, ids, 1, 64, policy, budget)
        assert torch.equal(out, alone) and meter.as_dict() == own.as_dict(), (policy, budget)
