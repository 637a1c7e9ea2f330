"""The curriculum runner: plan, chaining, resume/skip logic; helpers for the tests that run it (the
one end-to-end run is tests/test_curriculum_end_to_end.py)."""

import json
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from anchormass.curriculum.closing import report_jobs
from anchormass.curriculum.execute import command
from anchormass.curriculum.plan import datasets, merge_overrides, plan, stage_overrides, stage_runs
from anchormass.curriculum.recipe import load_recipe
from anchormass.errors import ConfigError

from _train_helpers import CONFIG_DIR, REPO


def tiny_curriculum(tmp_path, models: list, stages: list[tuple], **keys) -> dict:
    """A curriculum of 2-step stages (stage, init_from, seq_len) on a very small demo corpus in
    tmp_path, saved as tmp_path/configs/curriculum/t.yaml: a process start costs more than the training."""
    data = str(tmp_path / "data" / "demo")
    shrink = {"out_dir": data, "source.params.n_docs": 30, "source.params.min_sentences": 40,
              "source.params.max_sentences": 80, "tokenizer.vocab_size": 400}
    fast = {"global_batch_size": 2, "micro_batch_size": 2, "warmup_steps": 1, "val_every": 2, "val_batches": 1,
            "ckpt_every": 2}
    cur = {"name": "t", "models": models, "trainer": "cpu",
           "overrides": ["logger=none", "stage.datamodule.num_workers=0", "torch_threads=1"],
           "stages": [{"stage": stage, "init_from": parent, "data": "demo", "data_set": shrink,
                       "set": {**fast, "seq_len": seq_len, "total_steps": 2}} for stage, parent, seq_len in stages],
           **keys}
    (tmp_path / "configs" / "curriculum").mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cur, tmp_path / "configs" / "curriculum" / "t.yaml")
    return cur


def curriculum_cmd(tmp_path, cur: dict) -> list[str]:
    """scripts/run_curriculum.py on the tiny curriculum, runs under tmp_path/runs."""
    return [sys.executable, str(REPO / "scripts" / "run_curriculum.py"),
            f"hydra.searchpath=[file://{tmp_path / 'configs'}]", f"curriculum={cur['name']}",
            f"runs_root={tmp_path / 'runs'}"]


def planned_runs(recipe, runs_root, extra=()):
    """The recipe's plan as the train.py processes it becomes (the records' one edge, train_args)."""
    return stage_runs(recipe, plan(recipe, runs_root, extra))


def load_curriculum(name: str):
    """configs/curriculum/<name>.yaml as scripts/run_curriculum.py composes it."""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return load_recipe(compose("run_curriculum", overrides=[f"curriculum={name}"]).curriculum)


def test_mini_plan_chains_stages_for_both_models(tmp_path):
    cfg = load_curriculum("mini")
    runs = planned_runs(cfg, tmp_path, ["trainer=cpu"])
    assert [(r.model, r.stage) for r in runs[:6]] == [("standard_tiny_h8", s) for s in
                                                      ["pretrain_1k", "warmup_4k", "longctx_8k", "longctx_16k",
                                                       "longctx_32k", "chat_sft"]]
    by = {(r.model, r.stage): r for r in runs}
    for model in ("standard_tiny_h8", "anchormass_tiny_h8"):
        assert by[(model, "pretrain_1k")].init_from is None
        assert by[(model, "longctx_8k")].init_from == by[(model, "warmup_4k")].last_ckpt  # 2 -> 3a
        assert by[(model, "chat_sft")].init_from == by[(model, "warmup_4k")].last_ckpt  # 2 -> 3b
        assert by[(model, "longctx_32k")].out_dir == tmp_path / "mini" / model / "longctx_32k"
    # Stage 1 is shared (one function at 64 tokens): AnchorMass's stage 2 starts from Standard's stage 1.
    assert by[("anchormass_tiny_h8", "pretrain_1k")].shared_from is by[("standard_tiny_h8", "pretrain_1k")]
    assert by[("anchormass_tiny_h8", "warmup_4k")].init_from == by[("standard_tiny_h8", "pretrain_1k")].last_ckpt
    # Both models get identical data arguments (seed-synchronised batches).
    strip = lambda r: [a for a in r.args if not a.startswith(("model=", "hydra.run.dir=", "init_across_arch="))]  # noqa: E731
    assert strip(by[("standard_tiny_h8", "warmup_4k")]) == strip(by[("anchormass_tiny_h8", "warmup_4k")])


def test_datasets_prepare_pretraining_corpora_before_what_reads_them():
    # mini's stage 1 reads recall episodes built over data/demo, which stage 2 trains on
    folders = [f.name for _, f in datasets(load_curriculum("mini"))]
    assert folders[0] == "demo" and folders.index("demo_recall_pretrain") > 0 and len(folders) == len(set(folders))


def test_ablations_pair_each_variant_with_the_full_model_on_identical_data(tmp_path):
    cfg = load_curriculum("ablations")
    runs = planned_runs(cfg, tmp_path, [])
    jobs = report_jobs(cfg, runs, tmp_path / "ablations")
    variants = [s.name for s in cfg.models][1:]
    assert list(cfg.seeds) == [0, 1, 2] and [(j.name, j.seed) for j in jobs] == [(v, s) for v in variants
                                                                                for s in cfg.seeds]
    assert all(j.a.model == "anchormass_full" and j.a.seed == j.b.seed for j in jobs)
    assert [j.b.model for j in jobs] == [v for v in variants for _ in cfg.seeds]
    assert all(j.a.stage == j.b.stage == "longctx_8k" for j in jobs)
    by = {(r.model, r.stage): r for r in runs if r.seed == 0}
    own_dir = lambda args: {a for a in args if not a.startswith("hydra.run.dir=")}  # noqa: E731
    full = own_dir(by[("anchormass_full", "longctx_8k")].args)
    for spec in cfg.models[1:]:
        args = own_dir(by[(spec.name, "longctx_8k")].args)
        # the variant's own overrides are the only difference from the full model's stage arguments
        assert args - full == set(spec.overrides) and full <= args


def test_full_curriculum_plans_and_datasets():
    cfg = load_curriculum("full_158m")
    runs = planned_runs(cfg, REPO / "runs", ["trainer=ddp", "trainer.devices=8"])
    assert {r.model for r in runs} == {"standard_158m", "anchormass_158m"} and len(runs) == 12
    assert all("trainer=ddp" in r.args and "trainer=gpu" not in r.args for r in runs)
    folders = [f.name for _, f in datasets(cfg)]
    assert folders == ["aozora", "full_158m_longctx_8k", "full_158m_longctx_16k", "full_158m_longctx_32k",
                       "full_158m_chat_sft"]  # a stage that changes its data's settings gets its own dataset


def test_runner_options_stay_with_the_runner_and_the_rest_go_to_every_stage():
    task = ["curriculum=full_158m", "curriculum.parallel=1", "runs_root=/r", "evaluate=false", "verbose=2",
            "trainer=ddp", "trainer.devices=8", "+optim.foo=1"]
    hydra = ["hydra.searchpath=[file:///x]", "hydra/launcher=slurm", "hydra.launcher.partition=gpu"]
    assert stage_overrides(task, hydra) == ["trainer=ddp", "trainer.devices=8", "+optim.foo=1", "hydra/launcher=slurm",
                                            "hydra.launcher.partition=gpu"]


def test_merge_overrides_later_wins():
    assert merge_overrides(["trainer=gpu", "a.b=1", "trainer=ddp", "a.b=2"]) == ["trainer=ddp", "a.b=2"]


def test_command_resumes_own_checkpoint_else_starts_from_parent(tmp_path):
    runs = planned_runs(load_curriculum("mini"), tmp_path, [])
    warm = runs[1]
    assert f"init_from={runs[0].last_ckpt}" in command(warm)
    warm.last_ckpt.parent.mkdir(parents=True)
    warm.last_ckpt.write_bytes(b"x")
    cmd = command(warm)
    assert "ckpt_path=last" in cmd and not any(a.startswith("init_from=") for a in cmd)
    assert not warm.is_done()
    (warm.out_dir / "train_result.json").write_text(json.dumps({"global_step": 60, "total_steps": 60}))
    assert not warm.is_done()  # a record that does not say completed (an interrupted run says false)
    (warm.out_dir / "train_result.json").write_text(json.dumps({"global_step": 60, "total_steps": 60,
                                                               "completed": True}))
    assert warm.is_done()


def test_bad_curricula_are_rejected(tmp_path):
    stages = [{"stage": "warmup_4k", "data": "demo", "init_from": "pretrain_1k"}]
    with pytest.raises(ConfigError, match="lacks 'stages'"):
        load_recipe(OmegaConf.create({"name": "x", "models": ["standard_tiny"]}))
    with pytest.raises(ConfigError, match="stage warmup_4k needs 'data'"):
        load_recipe(OmegaConf.create({"name": "x", "models": ["a"], "stages": [{"stage": "warmup_4k"}]}))
    with pytest.raises(ConfigError, match="unknown keys \\['dta'\\]"):
        load_recipe(OmegaConf.create({"name": "x", "models": ["a"], "stages": {"warmup_4k": {"dta": "demo"}}}))
    for parallel in ("two", 0, 1.5, True):
        with pytest.raises(ConfigError, match="curriculum.parallel must be a whole number"):
            load_recipe(OmegaConf.create({"name": "x", "models": ["a"], "stages": stages, "parallel": parallel}))
    bad = load_recipe(OmegaConf.create({"name": "x", "models": ["standard_tiny"], "stages": stages}))
    with pytest.raises(ConfigError, match="not an earlier stage"):
        planned_runs(bad, tmp_path, [])
