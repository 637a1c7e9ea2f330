"""The 158M presets (the curriculum's models) build and run on CPU: forward + backward at a short
length, one optimizer step, and a cache prefill + decode, so a full-size config cannot break silently.

80 tokens = 16 sinks + one complete 64-token block: the AnchorMass global path forms slots.
"""

import math

import pytest
import torch

from anchormass.cache import new_cache
from anchormass.inference import generate
from anchormass.models import build_model
from anchormass.models.accounting import count_parameters, param_count
from anchormass.training.loss import chunked_cross_entropy
from anchormass.training.optim import build_optimizer

T = 80


@pytest.mark.slow
@pytest.mark.parametrize("name", ["anchormass_158m", "standard_158m"])
def test_158m_trains_one_step_and_decodes(name):
    torch.manual_seed(0)
    model = build_model(name)
    cfg = model.cfg
    assert count_parameters(model) == param_count(cfg) == 158_635_776
    ids = torch.randint(0, cfg.vocab_size, (1, T + 1))
    hidden = model.forward_hidden(ids[:, :-1])  # [1, T, d]
    loss, _ = chunked_cross_entropy(hidden, model.lm_head, ids[:, 1:])
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.5  # random init: about uniform
    want = model.lm_head(hidden[:, -1]).detach()  # parallel-path logits at position T - 1

    with torch.no_grad():  # the same position through a cache: two prefill chunks, then one decode step
        cache = new_cache(model, batch_size=1, budget=None if cfg.arch == "standard" else 64)
        generate.prefill(model, ids[:, :T - 1], cache, 48)
        got = model(ids[:, T - 1:T], cache=cache)[:, -1]
    assert cache.seen_tokens == T
    assert (got - want).abs().max().item() <= 1e-3

    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    opt, _ = build_optimizer(model, lr=1e-3, weight_decay=0.1, warmup_steps=1, total_steps=2)
    before = model.lm_head.weight.detach().clone()
    opt.step()
    assert torch.isfinite(model.lm_head.weight).all() and not torch.equal(before, model.lm_head.weight)
