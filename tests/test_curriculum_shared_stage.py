"""A curriculum's `shared: true` stage: trained once by the first model, the others start their
next stage from it (across architectures), refused wherever the models are not one function at
that length or would train it differently (run end to end in tests/test_curriculum_end_to_end.py)."""


import pytest
from omegaconf import OmegaConf

from anchormass.curriculum.execute import command
from anchormass.curriculum.recipe import load_recipe
from anchormass.errors import ConfigError

from test_train_curriculum import planned_runs

STAGES = [{"stage": "pretrain_1k", "init_from": None, "data": "demo", "shared": True,
           "set": {"seq_len": 64, "total_steps": 2}},
          {"stage": "warmup_4k", "init_from": "pretrain_1k", "data": "demo", "set": {"seq_len": 128}}]


def curriculum(models, stages=STAGES, **keys):
    return load_recipe(OmegaConf.create({"name": "s", "models": models, "stages": stages, "parallel": 2,
                                              "overrides": ["torch_threads=1"], **keys}))


def test_shared_stage_is_planned_once_and_feeds_every_model(tmp_path):
    models = ["standard_tiny_h8", "anchormass_tiny_h8",
              {"name": "lossless", "model": "anchormass_tiny_h8", "overrides": ["model.group_size=1"]}]
    runs = planned_runs(curriculum(models, seeds=[0, 1]), tmp_path, [])
    by = {(r.seed, r.model, r.stage): r for r in runs}
    for seed in (0, 1):
        owner = by[(seed, "standard_tiny_h8", "pretrain_1k")]
        assert owner.shared_from is None and "torch_threads=2" in owner.args  # the waiting chains' cores
        for model in ("anchormass_tiny_h8", "lossless"):
            shared = by[(seed, model, "pretrain_1k")]
            assert shared.shared_from is owner and shared.last_ckpt == owner.last_ckpt
            nxt = by[(seed, model, "warmup_4k")]
            assert nxt.init_from == owner.last_ckpt and "init_across_arch=true" in command(nxt)
            assert "torch_threads=1" in nxt.args
        assert "init_across_arch=true" not in by[(seed, "standard_tiny_h8", "warmup_4k")].args
    assert by[(0, "standard_tiny_h8", "pretrain_1k")].out_dir != by[(1, "standard_tiny_h8", "pretrain_1k")].out_dir


@pytest.mark.parametrize("models, stages, message", [
    (["standard_tiny_h8", "anchormass_tiny_h8"], [{**STAGES[0], "set": {"seq_len": 65}}],
     "one function only up to 64 tokens, not at seq_len 65"),
    (["standard_tiny_h8", {"name": "w32", "model": "anchormass_tiny_h8", "overrides": ["model.window=32"]}],
     STAGES, "one function only up to 32 tokens"),
    (["standard_tiny_h8", {"name": "wide", "model": "standard_tiny_h8", "overrides": ["model.init_std=0.05"]}],
     STAGES, "one function only up to 0 tokens"),
    (["standard_tiny_h8", {"name": "fast", "model": "anchormass_tiny_h8", "overrides": ["stage.lr=0.1"]}],
     STAGES, "trains it with other arguments than standard_tiny_h8: \\['stage.lr=0.1'\\]"),
    (["standard_tiny_h8", "anchormass_tiny_h8"], [STAGES[0], {**STAGES[1], "shared": True}],
     "must start from scratch"),
    (["standard_tiny_h8", "anchormass_tiny_h8"], [{**STAGES[0], "set": {"total_steps": 2}}], "set.seq_len"),
])
def test_a_stage_the_models_cannot_share_is_refused(tmp_path, models, stages, message):
    with pytest.raises(ConfigError, match=message):
        planned_runs(curriculum(models, stages), tmp_path, [])
