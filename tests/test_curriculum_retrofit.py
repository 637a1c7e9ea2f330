"""The retrofit study (curriculum=retrofit, docs/method.md §6 j): a stage may start from another
model's stage (checked like every chain, one line per error), per-stage model overrides make a
compression schedule, chains wait only for their own parents, and the study runs end to end with
tiny steps (slow); its pooled table is checked on synthetic per-seed results."""

import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from anchormass.curriculum.execute import command
from anchormass.curriculum.recipe import load_recipe
from anchormass.errors import ConfigError
from anchormass.eval.suites.retrofit.cells import chain_folders, learning_curve
from anchormass.eval.suites.retrofit.pool import pool_seeds
from anchormass.training.run import finished_run

from _train_helpers import REPO, subprocess_env
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
            shape = {"tiny": "tiny_h8", "faithful": "faithful", "l8g2": "l8g2"}[model.split("_")[0]]
            assert run.after is by[(seed, f"standard_{shape}", "longctx_32k")]
    doubled = by[(0, "faithful_g8_2x", "retro_32k")]
    assert "stage.total_steps=280" in doubled.args
    assert "stage.total_steps=140" in by[(0, "faithful_g8", "retro_32k")].args
    assert "model.group_size=4" in by[(1, "faithful_schedule", "retro_16k")].args
    assert {s for s, m, _ in by if m.startswith("l8g2") or m == "standard_l8g2"} == {0}
    assert "model.group_size=2" in by[(0, "l8g2_schedule", "retro_8k")].args
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


@pytest.mark.slow
def test_the_study_runs_end_to_end_with_tiny_steps(tmp_path):
    models = ("curriculum.models=[{name: standard_tiny_h8, model: standard_tiny_h8, stages: [pretrain_1k, warmup_4k,"
              " longctx_8k, longctx_16k, longctx_32k]},{name: tiny_g1, model: anchormass_tiny_h8,"
              " overrides: ['model.group_size=1'], stages: [retro_8k, retro_16k, retro_32k],"
              " init_from: {retro_8k: standard_tiny_h8/longctx_32k}},{name: tiny_schedule, model: anchormass_tiny_h8,"
              " stages: [retro_8k, retro_16k, retro_32k], init_from: {retro_8k: standard_tiny_h8/longctx_32k},"
              " stage_overrides: {retro_8k: ['model.group_size=2']}}]")
    cmd = [sys.executable, str(REPO / "scripts" / "run_curriculum.py"), f"runs_root={tmp_path}", "curriculum=retrofit",
           models, "curriculum.evaluate.retrofit.pair=[standard_tiny_h8,tiny_g1/retro_32k]", "curriculum.seeds=[0]",
           "curriculum.eval_overrides=['eval.retrofit.lengths=[256,512]','eval.retrofit.trained_length=256',"
           "'eval.retrofit.depths=[0.5]','eval.retrofit.seeds=[0,1]']",
           "stage.total_steps=2", "stage.val_every=1", "stage.val_batches=1", "stage.ckpt_every=1",
           "stage.warmup_steps=1", "stage.global_batch_size=2", "stage.micro_batch_size=2"]
    proc = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    root = tmp_path / "retrofit"
    res = json.loads((root / "report" / "retrofit" / "seed0" / "results.json").read_text())["suites"]["retrofit"]
    assert res["labels"] == ["standard_tiny_h8", "tiny_g1", "tiny_schedule"]
    assert res["models"]["tiny_g1"]["group_size"] == 1 and res["models"]["tiny_schedule"]["group_size"] == 8
    assert "faithful_g8" in res["left_out"]
    assert [p["stage"] for p in res["curves"]["tiny_g1"]] == ["retro_8k"] * 2 + ["retro_16k"] * 2 + ["retro_32k"] * 2
    nbytes = res["stored_bytes"]
    assert nbytes["tiny_schedule"] < nbytes["tiny_g1"] < nbytes["standard_tiny_h8"]
    pooled = (root / "report" / "retrofit" / "report.md").read_text()
    assert "Recall against compression, retrofit route" in pooled and "(control did not learn)" in pooled
    for png in ("retrofit_frontier.png", "retrofit_g8_vs_heads.png", "retrofit_curves.png"):
        assert (root / "report" / "retrofit" / png).stat().st_size > 0
