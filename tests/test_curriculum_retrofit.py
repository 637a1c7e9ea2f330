"""The retrofit study (curriculum=retrofit, docs/method.md §6 j): a stage may start from another
model's stage (checked like every chain, one line per error), per-stage model overrides make a
compression schedule, chains wait only for their own parents; the study's plan and closing comparison
are checked on its recipe, its pooled table and plots on synthetic per-seed results. The runner runs
end to end in tests/test_curriculum_end_to_end.py."""

import json

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from anchormass.curriculum.closing import report_jobs
from anchormass.curriculum.execute import command
from anchormass.curriculum.recipe import load_recipe
from anchormass.errors import ConfigError, DataError
from anchormass.eval.aggregate import write_aggregate
from anchormass.eval.suites.retrofit.cells import chain_folders, learning_curve
from anchormass.eval.suites.retrofit.plots import heads_plot
from anchormass.eval.suites.retrofit.pool import merge_runs, pool_seeds
from anchormass.runs.layout import finished_run

from _train_helpers import CONFIG_DIR
from test_train_curriculum import load_curriculum, planned_runs

STAGES = {"pre": {"stage": "pretrain_1k", "init_from": None, "data": "demo", "set": {"seq_len": 64}},
          "long": {"stage": "longctx_8k", "init_from": "pre", "data": "demo", "set": {"seq_len": 128}},
          "retro": {"stage": "longctx_8k", "init_from": None, "data": "demo", "set": {"seq_len": 128}}}
RETRO = {"name": "g8", "model": "anchormass_tiny_h8", "stages": ["retro"], "init_from": {"retro": "std/long"}}


def recipe(models, **keys):
    return load_recipe(OmegaConf.create({"name": "r", "models": models, "stages": STAGES, **keys}))


def std(**kw):
    return {"name": "std", "model": "standard_tiny_h8", "stages": ["pre", "long"], **kw}


def test_a_stage_starts_from_another_models_stage_across_architectures(tmp_path):
    sched = {**RETRO, "name": "sched", "stage_overrides": {"retro": ["model.group_size=2"]}}
    runs = planned_runs(recipe([std(), RETRO, sched], seeds=[0, 1]), tmp_path)
    by = {(r.seed, r.model, r.stage): r for r in runs}
    for seed in (0, 1):
        source = by[(seed, "std", "long")]
        for name in ("g8", "sched"):
            run = by[(seed, name, "retro")]
            assert run.init_from == source.last_ckpt and run.after is source  # waits for the Standard's chain
            assert "init_across_arch=true" in command(run)
        assert "model.group_size=2" in by[(seed, "sched", "retro")].args
        assert not any(a.startswith("model.group_size") for a in by[(seed, "g8", "retro")].args)
        assert by[(seed, "std", "long")].after is None and "init_across_arch=true" not in by[(seed, "std", "long")].args


def test_only_trains_the_named_models_of_a_recipe_as_it_defines_them(tmp_path):
    """curriculum.only=[names]: a study's later cells run without its earlier ones (whose checkpoints a
    new machine lacks); an unknown name is refused in one line naming the recipe's models."""
    sched = {**RETRO, "name": "sched", "stage_overrides": {"retro": ["model.group_size=2"]}}
    kept = recipe([std(), RETRO, sched], only=["std", "sched"])
    assert [m.name for m in kept.models] == ["std", "sched"]
    assert kept.models[1] == recipe([std(), RETRO, sched]).models[2]
    with pytest.raises(ConfigError, match=r"curriculum.only .*\['g9'\] is not among \['std', 'g8', 'sched'\]"):
        recipe([std(), RETRO, sched], only=["g9"])


def test_a_same_architecture_start_needs_no_flag(tmp_path):
    copy = {**RETRO, "name": "copy", "model": "standard_tiny_h8"}
    (run,) = [r for r in planned_runs(recipe([std(), copy]), tmp_path) if r.model == "copy"]
    assert "init_across_arch=true" not in run.args


@pytest.mark.parametrize("models, message", [
    ([RETRO, std()], "but std is not a model listed before g8"),
    ([std(), {**RETRO, "init_from": {"retro": "nobody/long"}}], "nobody is not a model listed before g8"),
    ([std(), {**RETRO, "init_from": {"retro": "std/retro"}}], "std does not train retro"),
    ([std(seeds=[0]), RETRO], "std does not train long under seed 1"),
    ([std(), {**RETRO, "model": "anchormass_faithful"}], "whose tensors differ \\(n_layers: 2 vs 4;"),
    ([std(), {**RETRO, "overrides": ["model.ffn_dim=32"]}], "whose tensors differ \\(ffn_dim: .* vs 32\\)"),
    ([std(), {**RETRO, "init_from": {"long": "std/long"}}], "init_from must map stages it trains"),
    ([std(), {**RETRO, "init_from": {"retro": 3}}], "init_from maps a stage to '<model>/<stage>'"),
    ([std(), {**RETRO, "stage_overrides": {"retro": "model.group_size=2"}}], "stage_overrides maps a stage to a list"),
])
def test_a_bad_cross_model_chain_is_one_line(tmp_path, models, message):
    with pytest.raises(ConfigError, match=message) as err:
        planned_runs(recipe(models, seeds=[0, 1]), tmp_path)
    assert "\n" not in str(err.value)


def test_the_study_recipe_plans_every_cell_from_its_own_standard(tmp_path):
    runs = planned_runs(load_curriculum("retrofit"), tmp_path)
    by = {(r.seed, r.model, r.stage): r for r in runs}
    assert {s for s, m, _ in by if m == "standard_faithful"} == {0, 1, 2}
    assert {s for s, m, _ in by if m == "tiny_g8"} == {0}
    for (seed, model, stage), run in by.items():
        if stage == "retro_8k":
            shape = {"tiny": "tiny_h8", "faithful": "faithful", "l8g2": "l8g2", "l4g2": "l4g2"}[model.split("_")[0]]
            assert run.after is by[(seed, f"standard_{shape}", "longctx_32k")]
    doubled = by[(0, "faithful_g8_2x", "retro_32k")]
    assert "stage.total_steps=280" in doubled.args
    assert "stage.total_steps=140" in by[(0, "faithful_g8", "retro_32k")].args
    assert "model.group_size=4" in by[(1, "faithful_schedule", "retro_16k")].args
    assert {s for s, m, _ in by if m.startswith("l8g2") or m == "standard_l8g2"} == {0}
    assert "model.group_size=2" in by[(0, "l8g2_schedule", "retro_8k")].args
    assert {s for s, m, _ in by if "l4g2" in m} == {0}
    assert "stage.lr=0.001" in by[(0, "standard_l4g2", "pretrain_1k")].args
    today = by[(0, "faithful_g8_scratch", "warmup_4k")]
    assert today.init_from == by[(0, "standard_faithful", "pretrain_1k")].last_ckpt


def _stage(folder, parent, steps, losses):
    folder.mkdir(parents=True)
    (folder / "stage_args.json").write_text(json.dumps({"args": [], "init_from": parent and str(
        parent / "checkpoints" / "last.ckpt")}))
    (folder / "train_result.json").write_text(json.dumps({"total_steps": steps}))
    rows = "".join(f"{s},{v}\n" for s, v in losses)
    (folder / "metrics.csv").write_text("step,val/loss\n" + rows)


def test_learning_curve_follows_the_chain_within_its_model(tmp_path):
    std_long = tmp_path / "std" / "long"
    _stage(std_long, None, 10, [(9, 3.0)])
    a, b = tmp_path / "g8" / "a", tmp_path / "g8" / "b"
    _stage(a, std_long, 4, [(1, 2.0), (3, 1.5)])
    _stage(b, a, 6, [(5, 1.0)])
    assert chain_folders(b) == [a, b]  # stops at the Standard it was retrofitted from
    assert [(p["stage"], p["step"], p["val_loss"]) for p in learning_curve(b)] == [
        ("a", 2, 2.0), ("a", 4, 1.5), ("b", 10, 1.0)]
    (b / "checkpoints").mkdir()
    (b / "checkpoints" / "last.ckpt").write_bytes(b"x")  # a stage still training has one too
    assert not finished_run(b)
    (b / "train_result.json").write_text(json.dumps({"completed": True, "global_step": 6, "total_steps": 6}))
    assert finished_run(b)


def _result(labels, exact_by_label, shape="s", n=5):
    """A per-seed suite result with n trials per length (trial i correct for i < exact)."""
    models = {lab: {"shape": shape, "arch": "standard" if lab == "std" else "anchormass",
                    "group_size": None if lab == "std" else int(lab[1:]), "outliers": True, "tags": ["frontier"],
                    "global_heads_total": 8} for lab in labels}
    items = [{"model": lab, "length": L, "depth": 0.5, "seed": i, "exact": i < exact_by_label[lab][L], "digits": 4}
             for lab in labels for L in (512, 1024, 2048) for i in range(n)]
    by_length = {lab: {str(L): {"n": n, "exact": exact_by_label[lab][L], "digits_mean": 4.0, "oom": 0}
                       for L in (512, 1024, 2048)} for lab in labels}
    return {"labels": labels, "models": models, "lengths": [512, 1024, 2048], "trained_length": 1024,
            "depths": [0.5], "seeds": list(range(n)), "by_length": by_length, "items": items,
            "stored_bytes": {lab: 1024 for lab in labels}, "probe": {lab: [] for lab in labels},
            "curves": {lab: [{"stage": "x", "step": 1, "val_loss": 0.5}] for lab in labels}}


def test_pooled_table_pairs_seeds_and_trials_and_names_an_unlearned_control():
    full = {L: 5 for L in (512, 1024, 2048)}
    none = {L: 0 for L in (512, 1024, 2048)}
    seed0 = _result(["std", "g1", "g8"], {"std": full, "g1": full, "g8": none})
    seed1 = _result(["std", "g1"], {"std": full, "g1": full})
    pooled = pool_seeds([seed0, seed1], [0, 1])
    cells = pooled["json"]["cells"]
    assert cells["std"]["by_length"][1024]["n"] == 10 and cells["g8"]["by_length"][1024]["n"] == 5
    assert cells["g8"]["seeds"] == [0]
    row = next(line for line in pooled["markdown"].splitlines() if line.startswith("| s | g8 "))
    assert "0% (0/5)" in row and "0.0625" in row  # 5 discordant pairs of seed 0 only: p = 2 / 2^5
    assert "did not learn" not in pooled["markdown"]
    weak = _result(["std", "g8"], {"std": {512: 5, 1024: 3, 2048: 5}, "g8": full})
    assert "(control did not learn)" in pool_seeds([weak], [0])["markdown"]


def test_the_study_scores_every_seed_from_its_standard_and_pools_the_seeds(tmp_path):
    """Its closing comparison: model A is each seed's Standard at its last stage, model B a retrofit
    cell at its own last stage (`<model>/<stage>`); every cell the suite scores is a run of the plan."""
    recipe = load_curriculum("retrofit")
    runs = planned_runs(recipe, tmp_path)
    root = tmp_path / "retrofit"
    jobs = report_jobs(recipe, runs, root)
    assert [(j.name, j.seed, j.a.model, j.a.stage, j.b.model, j.b.stage) for j in jobs] == [
        ("retrofit", s, "standard_faithful", "longctx_32k", "faithful_g8", "retro_32k") for s in recipe.seeds]
    assert all(j.out_dir == root / "report" / "retrofit" / f"seed{j.seed}" and "suite=retrofit" in j.overrides
               for j in jobs)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cells = compose("evaluate", overrides=["eval=retrofit"]).eval.retrofit.cells
    planned = {f"{r.model}/{r.stage}" for r in runs if r.seed == 0}
    assert [c.run for c in cells if c.run not in planned] == []  # the suite finds each cell's folder


def test_the_pooled_report_and_its_plots_through_the_aggregate(tmp_path):
    """The path the runner takes (anchormass/eval/aggregate.py:write_aggregate -> pool.py)."""
    full, none = {L: 5 for L in (512, 1024, 2048)}, {L: 0 for L in (512, 1024, 2048)}
    paths = []
    for seed, labels in enumerate([["std", "g1", "g8"], ["std", "g1"]]):
        path = tmp_path / f"seed{seed}" / "results.json"
        path.parent.mkdir()
        weak = {512: 5, 1024: 1, 2048: 5}  # the control misses at a trained length under seed 1
        path.write_text(json.dumps({"suites": {"retrofit": _result(
            labels, {"std": full if seed == 0 else weak, "g1": full, "g8": none})}}))
        paths.append(path)
    out = write_aggregate(paths, [0, 1], tmp_path / "retrofit")
    pooled = (out / "report.md").read_text()
    assert "Recall against compression, retrofit route" in pooled and "(control did not learn)" in pooled
    for png in ("retrofit_frontier.png", "retrofit_g8_vs_heads.png", "retrofit_curves.png"):
        assert (out / png).stat().st_size > 0, png


def test_one_seed_scored_in_parts_is_merged_before_pooling(tmp_path):
    """A study scores a seed's cells as they finish (several runs on identical trials): the aggregate
    merges them (a cell scored twice must agree trial for trial) and pools the seeds as usual."""
    full, none = {L: 5 for L in (512, 1024, 2048)}, {L: 0 for L in (512, 1024, 2048)}
    parts = {"a": _result(["std", "g1"], {"std": full, "g1": full}),
             "b": _result(["std", "g8"], {"std": full, "g8": none}),
             "c": _result(["std", "g1"], {"std": full, "g1": full})}
    paths = []
    for name, res in parts.items():
        paths.append(tmp_path / f"{name}_results.json")
        paths[-1].write_text(json.dumps({"suites": {"retrofit": res}}))
    out = write_aggregate(paths, [0, 0, 1], tmp_path / "pooled")
    cells = json.loads((out / "results.json").read_text())["suites"]["retrofit"]["json"]["cells"]
    assert list(cells) == ["std", "g1", "g8"]
    assert cells["std"]["by_length"]["2048"]["n"] == 10 and cells["std"]["seeds"] == [0, 1]  # seed 0 once
    assert cells["g8"]["seeds"] == [0] and cells["g8"]["by_length"]["2048"]["exact"] == 0
    assert "- seed 0: [../a_report.md](../a_report.md)" in (out / "report.md").read_text()  # each part's own report

    other = _result(["std"], {"std": {512: 5, 1024: 5, 2048: 4}})  # the same cell, another outcome
    with pytest.raises(DataError, match="cell std was scored in two runs with different outcomes"):
        merge_runs([parts["a"], other])
    shorter = {**parts["b"], "lengths": [512, 1024]}
    with pytest.raises(DataError, match=r"different trials \(lengths differ\)"):
        merge_runs([parts["a"], shorter])


def test_the_heads_plot_takes_two_shapes_with_as_many_global_heads(tmp_path):
    """tiny_h8 (8 heads of 16) and l4g2 (8 heads of 64) both have 8 global heads: the points sort by
    label after heads, never by comparing their result dicts (which raised TypeError)."""
    def cell(heads, acc):
        return {"info": {"tags": ["frontier", "g8"], "global_heads_total": heads},
                "by_length": {2048: {"acc": acc, "ci": [0.0, min(1.0, acc + 0.2)]}}}
    cells = {"tiny_g8": cell(8, 0.07), "l4g2_g8": cell(8, 0.0), "l8g2_g8": cell(16, 0.0)}
    out = tmp_path / "heads.png"
    heads_plot(cells, [2048], out)
    assert out.stat().st_size > 0


def test_finished_cells_are_each_models_last_stage_once_it_finished(tmp_path):
    """What scores a study's cells (scripts/retrofit_cells.py) gets each model's last stage's checkpoint,
    per seed, and only once that stage trained all its steps."""
    from anchormass.curriculum.cells import finished_cells
    from anchormass.curriculum.plan import plan
    from anchormass.runs.layout import last_checkpoint, result_file

    r = recipe([std(), RETRO], seeds=[0, 1])
    runs = {(p.seed, p.model, p.stage): p.out_dir for p in plan(r, tmp_path)}

    def finish(folder, completed=True):
        last_checkpoint(folder).parent.mkdir(parents=True)
        last_checkpoint(folder).write_bytes(b"")
        result_file(folder).write_text(json.dumps({"completed": completed, "global_step": 2, "total_steps": 2}))

    finish(runs[(0, "std", "pre")])
    finish(runs[(0, "g8", "retro")])
    finish(runs[(1, "g8", "retro")], completed=False)  # stopped on a signal: not a finished cell
    assert finished_cells(r, tmp_path) == {"g8_seed0": last_checkpoint(runs[(0, "g8", "retro")])}


def test_the_smollm2_recipe_starts_every_cell_from_an_import_with_equal_tokens(tmp_path):
    """configs/curriculum/retrofit_smollm2.yaml (docs/method.md §6 l): each model's first stage starts
    from an imported checkpoint file across architectures; attention-transfer stages say so; every
    design sees the same tokens per 90-step stage (the schedule's three stages add up to one)."""
    runs = planned_runs(load_curriculum("retrofit_smollm2"), tmp_path)
    first = {}
    for r in runs:
        first.setdefault(r.model, r)
    assert all(str(r.init_from).endswith(".ckpt") and "imports/smollm2" in str(r.init_from)
               and "init_across_arch=true" in r.args for r in first.values())
    assert "imports/smollm2/model.ckpt" in str(first["e2e_g8_index"].init_from)
    transfer = [r for r in runs if r.stage == "transfer_1k"]
    assert transfer and all("stage.objective={kind:attention_transfer}" in r.args for r in transfer)
    assert not any("objective" in a for r in runs if r.stage != "transfer_1k" for a in r.args)

    def tokens(model):
        total = 0
        for r in (r for r in runs if r.model == model):
            v = {a.split("=", 1)[0]: int(a.split("=", 1)[1]) for a in r.args
                 if a.startswith(("stage.total_steps=", "stage.global_batch_size=", "stage.seq_len="))}
            total += v["stage.total_steps"] * v["stage.global_batch_size"] * v["stage.seq_len"]
        return total

    assert {tokens(m) for m in first if m != "transfer_then_e2e_g8"} == {90 * 2 * 1024}
