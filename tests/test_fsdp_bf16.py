"""The FSDP and bf16 code paths as far as a CPU allows: the FSDP trainer config composes and its
strategy instantiates with the model's block as the wrap unit; a bf16-autocast training step runs
and stays close to fp32."""

import math

import torch
from hydra.utils import instantiate
from lightning.pytorch.strategies import FSDPStrategy

from anchormass.models import build_model, load_model_config
from anchormass.models.transformer import Block
from anchormass.training.loss import chunked_cross_entropy
from anchormass.training.optim import build_optimizer

from _train_helpers import compose_train


def test_fsdp_trainer_config_composes_and_instantiates(tmp_path):
    cfg = compose_train(["trainer=fsdp", "model=anchormass_158m"], tmp_path)
    t = cfg.trainer
    assert (t.accelerator, t.devices, t.precision) == ("gpu", 8, "bf16-mixed")
    strategy = instantiate(t.strategy)
    assert isinstance(strategy, FSDPStrategy)
    policy = strategy.kwargs["auto_wrap_policy"]  # Lightning turns the set into a ModuleWrapPolicy
    assert set(getattr(policy, "_module_classes", policy)) == {Block}
    assert str(strategy.sharding_strategy).endswith("FULL_SHARD")


def _step(model, ids, bf16: bool):
    opt, _ = build_optimizer(model, lr=1e-3, weight_decay=0.1, warmup_steps=1, total_steps=2)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss, _ = chunked_cross_entropy(model.forward_hidden(ids[:, :-1]), model.lm_head, ids[:, 1:])
    loss.backward()
    opt.step()
    return loss.item()


def test_bf16_autocast_training_step_on_cpu():
    # Both kernels' paths: sinks, complete blocks (slots with log-mass) and a tail.
    cfg = load_model_config("anchormass_tiny").replace(n_layers=2, vocab_size=512, block_size=16, group_size=4,
                                                       n_sinks=4, window=16, attn_impl="block_sdpa")
    ids = torch.randint(0, cfg.vocab_size, (2, 101), generator=torch.Generator().manual_seed(0))
    losses, weights = [], []
    for bf16 in (False, True):
        torch.manual_seed(0)
        model = build_model(cfg).train()
        losses.append(_step(model, ids, bf16))
        weights.append(model.lm_head.weight.detach())
        assert model.lm_head.weight.dtype == torch.float32  # autocast keeps fp32 master weights
    fp32_loss, bf16_loss = losses
    assert math.isfinite(bf16_loss) and abs(bf16_loss - fp32_loss) < 0.02 * fp32_loss
    assert torch.isfinite(weights[1]).all() and not torch.equal(weights[0], weights[1])  # bf16 really ran
