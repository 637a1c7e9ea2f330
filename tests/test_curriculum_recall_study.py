"""curriculum=recall_study (configs/curriculum/recall_study.yaml) without training: every seed's
chain is planned, each seed's frontier comparison scores the long-context stage with the recipe's
and the command line's evaluation settings, and the seeds' frontiers pool into one report through
the path the runner takes (anchormass/eval/aggregate.py:write_aggregate). The runner itself is run
end to end in tests/test_curriculum_end_to_end.py."""

import json

from hydra import compose, initialize_config_dir

from anchormass.curriculum.closing import report_jobs
from anchormass.curriculum.recipe import load_recipe
from anchormass.eval.aggregate import write_aggregate

from _train_helpers import CONFIG_DIR
from test_eval_frontier import _result
from test_train_curriculum import planned_runs

MODELS = ("standard_recall", "anchormass_recall")
SMALL_EVAL = "curriculum.eval_overrides=['eval.recall_frontier.lengths=[64,128]']"


def recall_study(*overrides: str):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return load_recipe(compose("run_curriculum", overrides=["curriculum=recall_study", *overrides]).curriculum)


def test_every_seed_trains_both_models_through_the_chain(tmp_path):
    recipe = recall_study("curriculum.seeds=[0,1]")
    runs = planned_runs(recipe, tmp_path)
    by = {(r.seed, r.model, r.stage): r for r in runs}
    assert {(s, m) for s, m, _ in by} == {(s, m) for s in (0, 1) for m in MODELS}
    for seed in (0, 1):
        std, am = (by[(seed, m, "pretrain_1k")] for m in MODELS)
        assert am.shared_from is std  # stage 1 is one function at 64 tokens: trained once per seed
        for model in MODELS:
            stages = [r.stage for r in runs if (r.seed, r.model) == (seed, model)]
            assert stages == ["pretrain_1k", "warmup_4k", "longctx_8k"]
            assert by[(seed, model, "longctx_8k")].init_from == by[(seed, model, "warmup_4k")].last_ckpt
            assert by[(seed, model, "longctx_8k")].out_dir == tmp_path / "recall_study" / f"seed{seed}" / model / \
                "longctx_8k"
            assert [a for a in by[(seed, model, "warmup_4k")].args if a.startswith("seed=")] == [f"seed={seed}"]


def test_each_seed_scores_the_frontier_of_its_long_context_stage(tmp_path):
    recipe = recall_study(SMALL_EVAL)
    assert list(recipe.seeds) == [0, 1, 2]
    root = tmp_path / "recall_study"
    jobs = report_jobs(recipe, planned_runs(recipe, tmp_path), root)
    assert [(j.name, j.seed, j.a.model, j.b.model, j.a.stage, j.b.stage) for j in jobs] == [
        ("frontier", s, *MODELS, "longctx_8k", "longctx_8k") for s in (0, 1, 2)]
    for job in jobs:
        assert job.out_dir == root / "report" / "frontier" / f"seed{job.seed}"
        assert job.overrides[0] == "suite=recall_frontier"  # the recipe's own, then the command line's
        assert job.overrides[-1] == "eval.recall_frontier.lengths=[64,128]"
        assert job.a.seed == job.b.seed == job.seed


def test_the_seeds_frontiers_pool_into_one_report_with_its_plot(tmp_path):
    paths = []
    for seed, (am, snap) in enumerate([([True, True, True, False], [False, True, False, False]),
                                       ([True, True, False, False], [False, False, False, False])]):
        path = tmp_path / f"seed{seed}" / "results.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"suites": {"recall_frontier": _result(
            {"anchormass/adaptive": am, "standard/snapkv": snap})}}))
        paths.append(path)
    out = write_aggregate(paths, [0, 1], tmp_path / "frontier", note="standard_recall vs anchormass_recall")
    pooled = (out / "report.md").read_text()
    assert "mean ± std over 2 training seed(s)" in pooled and "standard/snapkv" in pooled
    assert "62.5 ± 17.7%" in pooled and "seed1/report.md" in pooled
    assert (out / "recall_frontier.png").stat().st_size > 0
    saved = json.loads((out / "results.json").read_text())["suites"]["recall_frontier"]
    assert saved["plots"] == ["recall_frontier.png"] and len(saved["json"]["rows"]) == 2
