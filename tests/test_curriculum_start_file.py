"""A curriculum stage that starts from a checkpoint FILE the recipe names (an imported Standard, e.g.
imports/smollm2/model.ckpt; anchormass/curriculum/start_files.py): planned without a parent, with
`init_from=<absolute path> init_across_arch=true`; a missing file refused in one line before anything
trains; a replaced file a changed stage; and a tiny AnchorMass really trained 2 steps from such a file,
where train.py still refuses another shape or another tokenizer in one line."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from anchormass.curriculum.changes import check_changes
from anchormass.curriculum.execute import StageRun, command, stage_record
from anchormass.curriculum.recipe import load_recipe
from anchormass.curriculum.runner import run_curriculum
from anchormass.curriculum.stage_identity import identify
from anchormass.curriculum.start_files import check_start_files
from anchormass.errors import CheckpointError, ConfigError
from anchormass.runs.layout import stage_args_file
from anchormass.runs.train import train
from anchormass.training.checkpoint import read_checkpoint

from _train_helpers import CONFIG_DIR, FAST, compose_train
from test_train_curriculum import planned_runs, tiny_curriculum

FILE = "imports/std/model.ckpt"  # relative: taken from the folder the command runs in, like runs_root
STAGES = {"retro": {"stage": "pretrain_1k", "data": "demo", "set": {"seq_len": 64}},
          "next": {"stage": "warmup_4k", "data": "demo", "init_from": "retro", "set": {"seq_len": 64}}}


def recipe(models, stages=STAGES):
    return load_recipe(OmegaConf.create({"name": "r", "models": models, "stages": stages}))


def by_stage(runs, model):
    return {r.stage: r for r in runs if r.model == model}


def test_a_file_start_is_planned_without_a_parent(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    g8 = {"name": "g8", "model": "anchormass_tiny_h8", "init_from": {"retro": FILE}}
    runs = planned_runs(recipe(["standard_tiny_h8", g8]), tmp_path / "runs")
    retro, nxt = by_stage(runs, "g8")["retro"], by_stage(runs, "g8")["next"]
    assert retro.init_from == retro.start_file == tmp_path / FILE and retro.after is None  # waits for nobody
    assert "init_across_arch=true" in retro.args and f"init_from={tmp_path / FILE}" in command(retro)
    assert nxt.init_from == retro.last_ckpt and nxt.start_file is None and "init_across_arch=true" not in nxt.args
    assert by_stage(runs, "standard_tiny_h8")["retro"].init_from is None  # the model entry's own start only
    # a stage's own init_from may be a file too, absolute or not; a resumable stage resumes, as any
    stages = {**STAGES, "retro": {**STAGES["retro"], "init_from": str(tmp_path / "x.ckpt")}}
    (run, _) = planned_runs(recipe(["standard_tiny_h8"], stages), tmp_path / "runs")
    assert run.init_from == tmp_path / "x.ckpt" and "init_across_arch=true" in run.args
    (run.out_dir / "checkpoints").mkdir(parents=True)
    (run.out_dir / "checkpoints" / "last.ckpt").write_bytes(b"x")
    assert command(run)[-1] == "ckpt_path=last"


@pytest.mark.parametrize("start, message", [
    ("imports/a,b.ckpt", "g8's stage retro starts from file .*a,b.ckpt' cannot be passed on"),
    ("imports/m/model.safetensors", "imports is not a model listed before g8 .*a checkpoint file to start from "
                                    "ends in .ckpt"),
])
def test_a_start_file_the_plan_cannot_use_is_refused(tmp_path, start, message):
    g8 = {"name": "g8", "model": "anchormass_tiny_h8", "init_from": {"retro": start}}
    with pytest.raises(ConfigError, match=message) as err:
        planned_runs(recipe([g8]), tmp_path)
    assert "\n" not in str(err.value)


def test_a_missing_start_file_is_refused_in_one_line_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cur = tiny_curriculum(tmp_path, [{"name": "g", "model": "anchormass_tiny", "init_from": {"pretrain_1k": FILE}}],
                          [("pretrain_1k", None, 32)])
    searchpath = f"hydra.searchpath=[file://{tmp_path / 'configs'}]"
    task = [f"curriculum={cur['name']}", f"runs_root={tmp_path / 'runs'}"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("run_curriculum", overrides=[*task, searchpath])
    with pytest.raises(ConfigError, match=f"g's stage pretrain_1k starts from {FILE}, which is not a file") as err:
        run_curriculum(cfg, task, [searchpath])
    assert "\n" not in str(err.value)
    assert not (tmp_path / "data").exists() and not (tmp_path / "runs" / "t" / "g").exists()  # nothing prepared
    # a stage that is finished, or resumes its own checkpoint, no longer reads its start file
    run = StageRun("g", "s", tmp_path / "done", tmp_path / FILE, start_file=tmp_path / FILE)
    (run.out_dir / "checkpoints").mkdir(parents=True)
    (run.out_dir / "checkpoints" / "step-2.ckpt").write_bytes(b"x")
    check_start_files([run])


def test_a_replaced_start_file_is_a_changed_stage(tmp_path):
    start = tmp_path / "model.ckpt"
    start.write_bytes(b"weights 1")
    run = StageRun("g", "s", tmp_path / "g" / "s", start, ["stage=pretrain_1k"], start_file=start)
    (run.out_dir / "checkpoints").mkdir(parents=True)
    (run.out_dir / "checkpoints" / "last.ckpt").write_bytes(b"x")
    identify([run])
    stage_args_file(run.out_dir).write_text(json.dumps(stage_record(run)))
    check_changes([run], "refuse")  # the same file: the same stage
    start.write_bytes(b"weights 2, imported again")
    with pytest.raises(ConfigError, match=r"g/s does not match .*\(start file .*model.ckpt: sha256 \w{12} -> \w{12}\)"):
        check_changes([run], "refuse")
    plain = StageRun("g", "s", run.out_dir, None, ["stage=pretrain_1k"])  # the recipe no longer names the file
    with pytest.raises(ConfigError, match=r"it started from file .*model.ckpt, now from scratch"):
        check_changes([plain], "refuse")


def test_anchormass_trains_two_steps_from_a_standard_file_and_other_shapes_stay_refused(data, tmp_path, monkeypatch):
    """The planned train.py arguments, run in this process: the stage starts from the file's weights; a
    file of another width, or data of another tokenizer, is refused in one line despite init_across_arch."""
    std = train(compose_train(["model=standard_tiny", f"data_dir={data['pretrain']}", *FAST], tmp_path / "std"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / FILE).parent.mkdir(parents=True)
    shutil.copy(std["last_checkpoint"], tmp_path / FILE)
    g = {"name": "g", "model": "anchormass_tiny", "stages": ["retro"], "init_from": {"retro": FILE}}
    (run,) = planned_runs(recipe([g]), tmp_path / "runs", ["logger=none", "torch_threads=1", *FAST])

    def start(ckpt: Path, out: str):
        args = [a if not a.startswith("init_from=") else f"init_from={ckpt}" for a in command(run)[3:]]
        return train(compose_train([*args, f"data_dir={data['pretrain']}"], tmp_path / out))

    trained = read_checkpoint(start(tmp_path / FILE, "g")["last_checkpoint"])
    assert trained["hyper_parameters"]["model_config"]["arch"] == "anchormass" and trained["global_step"] == 2
    before = read_checkpoint(tmp_path / FILE)["state_dict"]["model.embed.weight"]
    moved = (trained["state_dict"]["model.embed.weight"] - before).abs().max().item()
    assert moved < 0.01  # two AdamW steps from the file's weights; a fresh init would be ~0.02 away
    saved = torch.load(tmp_path / FILE, weights_only=False)
    for name, change, message in [("wide", {"model_config": {"d_model": 256}}, "different model .*d_model: 256"),
                                  ("tok", {"tokenizer_checksum": "f" * 64}, "trained with tokenizer ffffffffffff")]:
        hp = {k: {**v, **change[k]} if isinstance(v, dict) and k in change else change.get(k, v)
              for k, v in saved["hyper_parameters"].items()}
        torch.save({**saved, "hyper_parameters": hp}, tmp_path / f"{name}.ckpt")
        with pytest.raises(CheckpointError, match=message) as err:
            start(tmp_path / f"{name}.ckpt", name)
        assert "\n" not in str(err.value)
