"""anchormass/models/equivalence.py: up to min(W, S + C) tokens every AnchorMass variant is the
Standard model (same weights -> same logits), and past it they differ, measured, not assumed. A
curriculum's `shared: true` stage relies on this."""

import pytest
import torch

from anchormass.models import build_model, load_model_config
from anchormass.models.equivalence import exact_attention_len, same_function_len

VARIANTS = [{}, {"outliers": False}, {"mass_bias": False}, {"background_key": "mean"}, {"group_size": 1},
            {"n_local_heads": 2, "n_global_heads": 6}, {"window": 32}]


def logits(cfg, state, ids):
    model = build_model(cfg).eval()
    model.load_state_dict(state)
    with torch.no_grad():
        return model(ids)


@pytest.mark.parametrize("changes", VARIANTS, ids=[",".join(f"{k}={v}" for k, v in c.items()) or "full"
                                                   for c in VARIANTS])
def test_anchormass_is_standard_up_to_exact_attention_len(changes):
    std = load_model_config("standard_tiny_h8")
    am = load_model_config("anchormass_tiny_h8").replace(**changes)
    n = int(same_function_len(std, am))
    assert n == exact_attention_len(am) == min(am.window, am.n_sinks + am.block_size)
    torch.manual_seed(0)
    state = build_model(std).state_dict()
    ids = torch.randint(0, std.vocab_size, (2, n + 24), generator=torch.Generator().manual_seed(1))
    a, s = logits(am, state, ids), logits(std, state, ids)
    assert torch.allclose(a[:, :n], s[:, :n], atol=1e-5, rtol=0)
    # one token past it a local window drops position 0 (or a block is compressed): different logits
    assert (a[:, n:] - s[:, n:]).abs().max() > 1e-3


def test_fields_that_act_at_every_length_make_two_configs_different_functions():
    am = load_model_config("anchormass_tiny_h8")
    assert same_function_len(am, am) == 64
    std = load_model_config("standard_tiny_h8")
    assert same_function_len(std, load_model_config("standard_tiny_h8")) == float("inf")
    for changes in ({"rope_theta": 5e5}, {"init_std": 0.01}, {"norm_eps": 1e-6}, {"n_layers": 3}):
        assert same_function_len(am, am.replace(**changes)) == 0
