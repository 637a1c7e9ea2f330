"""Curricula with several training seeds, model variants and per-entry comparison pairs (plan level;
run end to end in tests/test_curriculum_end_to_end.py)."""

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from anchormass.curriculum.closing import report_jobs
from anchormass.curriculum.recipe import load_recipe
from anchormass.errors import ConfigError

from _train_helpers import CONFIG_DIR
from test_train_curriculum import planned_runs

STAGES = [{"stage": "pretrain_1k", "init_from": None, "data": "demo"},
          {"stage": "warmup_4k", "init_from": "pretrain_1k", "data": "demo"}]
VARIANT = {"name": "no_outliers", "model": "anchormass_tiny", "overrides": ["model.outliers=false"]}


def curriculum(**keys):
    return load_recipe(OmegaConf.create({"name": "c", "models": ["standard_tiny", "anchormass_tiny"],
                                              "stages": STAGES, "overrides": ["logger=none", "seed=7"], **keys}))


def test_seeds_give_one_chain_per_seed_and_model_with_the_seed_override(tmp_path):
    runs = planned_runs(curriculum(seeds=[0, 1, 2]), tmp_path, ["seed=99"])
    assert len(runs) == 3 * 2 * 2
    by = {(r.seed, r.model, r.stage): r for r in runs}
    for s in (0, 1, 2):
        for model in ("standard_tiny", "anchormass_tiny"):
            warm = by[(s, model, "warmup_4k")]
            assert warm.out_dir == tmp_path / "c" / f"seed{s}" / model / "warmup_4k"
            assert warm.init_from == by[(s, model, "pretrain_1k")].last_ckpt  # chained within the seed
            # the chain's seed wins over the curriculum's and the command line's seed=
            assert [a for a in warm.args if a.startswith("seed=")] == [f"seed={s}"]
            assert warm.chain == (s, model)
        # the two models of a seed differ only in the model and the folder: identical data and seed
        strip = lambda r: [a for a in r.args if not a.startswith(("model=", "hydra.run.dir="))]  # noqa: E731
        assert strip(by[(s, "standard_tiny", "warmup_4k")]) == strip(by[(s, "anchormass_tiny", "warmup_4k")])
    assert by[(0, "standard_tiny", "pretrain_1k")].args != by[(1, "standard_tiny", "pretrain_1k")].args


def test_without_seeds_the_layout_and_arguments_are_unchanged(tmp_path):
    runs = planned_runs(curriculum(), tmp_path, [])
    assert [r.seed for r in runs] == [None] * 4
    assert runs[0].out_dir == tmp_path / "c" / "standard_tiny" / "pretrain_1k"
    assert [a for a in runs[0].args if a.startswith("seed=")] == ["seed=7"]


def test_seeds_override_on_the_command_line():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("run_curriculum", overrides=["curriculum=mini", "curriculum.seeds=[0,1]"]).curriculum
        plain = compose("run_curriculum", overrides=["curriculum=mini"]).curriculum
    assert cfg.seeds == [0, 1] and plain.seeds is None


@pytest.mark.parametrize("bad", [[], [0, 0], ["a"], [True], 3, "0"])
def test_bad_seeds_are_one_line_errors(bad):
    with pytest.raises(ConfigError, match="curriculum.seeds must be a non-empty list of distinct integers"):
        curriculum(seeds=bad)


def test_variants_get_their_label_and_overrides_after_the_curriculum_ones(tmp_path):
    cfg = curriculum(models=["anchormass_tiny", VARIANT], overrides=["logger=none", "model.outliers=true"])
    runs = planned_runs(cfg, tmp_path, ["optim.weight_decay=0.05"])
    by = {(r.model, r.stage): r for r in runs}
    var = by[("no_outliers", "warmup_4k")]
    assert var.out_dir == tmp_path / "c" / "no_outliers" / "warmup_4k"
    assert "model=anchormass_tiny" in var.args and "model.outliers=false" in var.args
    assert "model.outliers=true" not in var.args and "optim.weight_decay=0.05" in var.args
    assert var.init_from == by[("no_outliers", "pretrain_1k")].last_ckpt
    assert "model.outliers=true" in by[("anchormass_tiny", "warmup_4k")].args


@pytest.mark.parametrize("models, match", [
    (["anchormass_tiny", {**VARIANT, "name": "anchormass_tiny"}], "labels must be unique, anchormass_tiny repeats"),
    ([{"name": "x"}], "a models entry is a preset name or"),
    ([{"name": "x", "model": "anchormass_tiny", "override": []}], "unknown keys"),
])
def test_bad_model_entries_are_one_line_errors(models, match):
    with pytest.raises(ConfigError, match=match):
        curriculum(models=models)


def test_evaluate_pairs_default_to_the_first_two_models_and_run_per_seed(tmp_path):
    cfg = curriculum(models=["standard_tiny", "anchormass_tiny", VARIANT], seeds=[3, 5],
                     evaluate=[{"name": "main", "stage": "warmup_4k", "overrides": ["suite=ppl"]},
                               {"name": "ablation", "stage": "pretrain_1k",
                                "pair": ["anchormass_tiny", "no_outliers"]}])
    assert [(e.name, e.a, e.b) for e in cfg.evaluate] == [
        ("main", "standard_tiny", "anchormass_tiny"), ("ablation", "anchormass_tiny", "no_outliers")]
    root = tmp_path / "c"
    jobs = report_jobs(cfg, planned_runs(cfg, tmp_path, []), root)
    assert [(j.name, j.seed, j.a.model, j.b.model, j.a.stage) for j in jobs] == [
        ("main", 3, "standard_tiny", "anchormass_tiny", "warmup_4k"),
        ("main", 5, "standard_tiny", "anchormass_tiny", "warmup_4k"),
        ("ablation", 3, "anchormass_tiny", "no_outliers", "pretrain_1k"),
        ("ablation", 5, "anchormass_tiny", "no_outliers", "pretrain_1k")]
    assert jobs[1].out_dir == root / "report" / "main" / "seed5" and jobs[1].overrides == ["suite=ppl"]
    assert jobs[1].a.seed == jobs[1].b.seed == 5 and jobs[1].a.out_dir.parent.parent.name == "seed5"


def test_evaluate_without_seeds_keeps_the_report_folder(tmp_path):
    cfg = curriculum(evaluate=[{"name": "main", "stage": "warmup_4k"}])
    [job] = report_jobs(cfg, planned_runs(cfg, tmp_path, []), tmp_path / "c")
    assert job.out_dir == tmp_path / "c" / "report" / "main" and job.seed is None


@pytest.mark.parametrize("models, entry, match", [
    (["anchormass_tiny"], {"name": "m", "stage": "warmup_4k"}, "needs two models"),
    (["standard_tiny", "anchormass_tiny"], {"name": "m", "stage": "warmup_4k", "pair": ["standard_tiny", "x"]},
     "pair must name two different models"),
    (["standard_tiny", "anchormass_tiny"], {"name": "m", "stage": "warmup_4k", "pair": ["standard_tiny"] * 2},
     "pair must name two different models"),
    (["standard_tiny", "anchormass_tiny"], {"name": "m", "stage": "nope"}, "needs a name and one of the stages"),
])
def test_bad_evaluate_entries_are_one_line_errors(models, entry, match):
    with pytest.raises(ConfigError, match=match):
        curriculum(models=models, evaluate=[entry])


def test_a_model_may_train_only_some_stages_and_seeds(tmp_path):
    """Per-model `stages:`/`seeds:`: one file holds models that take different routes; a stage entry
    with a `name` reuses a preset under its own folder, chained to its own init_from."""
    stages = STAGES + [{"name": "warmup_up", "stage": "warmup_4k", "init_from": "pretrain_1k", "data": "demo"}]
    cfg = curriculum(seeds=[0, 1], stages=stages, evaluate=[{"name": "cmp", "stage": "pretrain_1k"}], models=[
        {"name": "a", "model": "standard_tiny", "stages": ["pretrain_1k", "warmup_4k"]},
        {"name": "b", "model": "anchormass_tiny", "stages": ["pretrain_1k", "warmup_up"], "seeds": [1]}])
    runs = planned_runs(cfg, tmp_path, [])
    assert [(r.seed, r.model, r.stage) for r in runs] == [
        (0, "a", "pretrain_1k"), (0, "a", "warmup_4k"),
        (1, "a", "pretrain_1k"), (1, "a", "warmup_4k"), (1, "b", "pretrain_1k"), (1, "b", "warmup_up")]
    up = runs[-1]
    assert up.out_dir == tmp_path / "c" / "seed1" / "b" / "warmup_up" and "stage=warmup_4k" in up.args
    assert up.init_from == runs[-2].last_ckpt
    # the comparison of a and b exists only under the seed both trained
    assert [j.seed for j in report_jobs(cfg, runs, tmp_path)] == [1]


@pytest.mark.parametrize("model, message", [
    ({"stages": ["nope"]}, "stages must be a non-empty list of"),
    ({"stages": []}, "stages must be a non-empty list of"),
    ({"seeds": [5]}, "seeds must be a non-empty subset of curriculum.seeds"),
    ({"stages": ["warmup_4k"]}, "starts from pretrain_1k, which is not an earlier stage b trains"),
])
def test_bad_per_model_routes_are_one_line_errors(tmp_path, model, message):
    with pytest.raises(ConfigError, match=message):
        variant = {"name": "b", "model": "anchormass_tiny", **model}
        planned_runs(curriculum(seeds=[0], models=["standard_tiny", variant]), tmp_path, [])


def test_repeated_stage_names_are_refused():
    with pytest.raises(ConfigError, match="stages names must be unique .* warmup_4k repeats"):
        curriculum(stages=STAGES + [STAGES[1]])
