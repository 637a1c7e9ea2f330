"""Unit tests of the training pieces: schedule, decay groups, chunked loss, batch split, checkpoint IO."""

import math

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from anchormass.errors import CheckpointError, ConfigError
from anchormass.models import build_model
from anchormass.models.config import load_model_config
from anchormass.runs.trainer import accumulation
from anchormass.training.checkpoint import atomic_torch_save, load_model, read_checkpoint
from anchormass.training.loss import chunked_cross_entropy
from anchormass.training.optim import build_optimizer, lr_factor, param_groups


def test_schedule_warmup_then_cosine_to_floor():
    f = [lr_factor(s, warmup_steps=10, total_steps=110, min_lr_ratio=0.1) for s in range(130)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)  # linear warmup ends at peak
    assert all(a >= b for a, b in zip(f[9:110], f[10:111]))  # then non-increasing
    assert f[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))  # halfway
    assert f[110] == pytest.approx(0.1) and f[129] == pytest.approx(0.1)  # floor after the stage's total


def test_schedule_depends_on_total_steps_not_on_stop():
    # The lr at step 50 of a 1,000-step stage is the same whether the run stops at 60 or at 1,000:
    # the optimizer's scheduler follows lr_factor of the configured total, step by step.
    opt, sched = build_optimizer(torch.nn.Linear(2, 2), lr=1e-3, weight_decay=0.1, warmup_steps=10,
                                 total_steps=1000, min_lr_ratio=0.0)
    for step in range(60):
        assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * lr_factor(step, 10, 1000, 0.0))
        opt.step()
        sched.step()
    assert lr_factor(50, 10, 1000, 0.0) > lr_factor(50, 10, 100, 0.0)


def test_bad_optim_settings_rejected():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="warmup_steps"):
        build_optimizer(model, lr=1e-3, weight_decay=0.1, warmup_steps=20, total_steps=10)
    with pytest.raises(ConfigError, match="lr"):
        build_optimizer(model, lr=0.0, weight_decay=0.1, warmup_steps=0, total_steps=10)


def test_weight_decay_groups_cover_every_parameter_once():
    model = build_model(load_model_config("anchormass_tiny").replace(vocab_size=300))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    ids = [id(p) for g in (decay, no_decay) for p in g["params"]]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())
    assert all(p.dim() == 1 for p in no_decay["params"])  # norm gains only
    assert any(p is model.lm_head.weight for p in decay["params"])


@pytest.mark.parametrize("chunk", [3, 8, 64])
def test_chunked_loss_equals_full_loss_and_gradients(chunk):
    torch.manual_seed(0)
    B, T, D, V = 2, 19, 8, 11
    hidden = torch.randn(B, T, D, requires_grad=True)
    head = torch.nn.Linear(D, V, bias=False)
    targets = torch.randint(0, V, (B, T))
    targets[0, :5] = -100  # e.g. an SFT prompt
    loss, n = chunked_cross_entropy(hidden, head, targets, chunk)
    loss.backward()
    g_h, g_w = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None
    ref = F.cross_entropy(head(hidden).flatten(0, 1), targets.flatten(), ignore_index=-100)
    ref.backward()
    assert n.item() == B * T - 5
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(hidden.grad, g_h)
    torch.testing.assert_close(head.weight.grad, g_w)


def test_all_ignored_batch_gives_zero_not_nan():
    hidden = torch.randn(1, 4, 3)
    loss, n = chunked_cross_entropy(hidden, torch.nn.Linear(3, 5, bias=False), torch.full((1, 4), -100), 2)
    assert n.item() == 0 and loss.item() == 0.0


@pytest.mark.parametrize("g, micro, world, expected", [(64, 16, 1, 4), (64, 16, 8, 1), (64, 64, 1, 1),
                                                       (2, 2, 2, 1), (12, 5, 1, 3), (16, 1, 2, 8)])
def test_accumulation_splits_global_batch(g, micro, world, expected):
    stage = OmegaConf.create({"global_batch_size": g, "micro_batch_size": micro})
    acc = accumulation(stage, world)
    assert acc == expected
    assert g == (g // (world * acc)) * world * acc and g // (world * acc) <= micro


def test_accumulation_rejects_uneven_split():
    with pytest.raises(ConfigError, match="devices"):
        accumulation(OmegaConf.create({"global_batch_size": 6, "micro_batch_size": 2}), 4)


def test_checkpoint_errors_are_one_line(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        load_model(tmp_path / "missing.ckpt")
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read"):
        read_checkpoint(junk)
    atomic_torch_save({"state_dict": {}}, tmp_path / "partial.ckpt")
    with pytest.raises(CheckpointError, match="not an AnchorMass training checkpoint"):
        read_checkpoint(tmp_path / "partial.ckpt")
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # no temp files left


def test_load_model_rejects_mismatched_weights(tmp_path):
    cfg = load_model_config("standard_tiny").replace(vocab_size=300)
    model = build_model(cfg)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    state["model.lm_head.weight"] = torch.zeros(301, cfg.d_model)
    atomic_torch_save({"state_dict": state, "hyper_parameters": {"model_config": cfg.to_dict()}}, tmp_path / "x.ckpt")
    with pytest.raises(CheckpointError, match="does not fit"):
        load_model(tmp_path / "x.ckpt")


def test_rng_state_survives_a_weights_only_checkpoint_load(tmp_path):
    import random

    import numpy as np

    from anchormass.training.callbacks import RngState

    cb = RngState()
    atomic_torch_save(cb.state_dict(), tmp_path / "rng.pt")
    expected = (random.random(), float(np.random.rand()), torch.rand(3))
    cb.load_state_dict(torch.load(tmp_path / "rng.pt", weights_only=True))  # what Lightning does on resume
    got = (random.random(), float(np.random.rand()), torch.rand(3))
    assert expected[:2] == got[:2] and torch.equal(expected[2], got[2])
