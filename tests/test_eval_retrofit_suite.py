"""suite=retrofit on a seed folder of real (random-init) checkpoints, in process: every finished cell is
scored on the same trials, an unfinished one is left out by name, stored bytes fall with the group
size, each cell's learning curve follows its chain of stages, and the slot probe covers every layer.
The pooled report over seeds is checked on synthetic results in tests/test_curriculum_retrofit.py."""

import json

import pytest
import torch

from anchormass.eval.runner import run_evaluation
from anchormass.models import build_model
from anchormass.models.config import load_model_config
from anchormass.training.checkpoint import STATE_PREFIX

from test_eval_end_to_end import VOCAB, assets, common, compose_cfg  # noqa: F401  (assets is a fixture)

CELLS = [("std", "std/long", "standard_tiny_h8", {}), ("g1", "g1/retro", "anchormass_tiny_h8", {"group_size": 1}),
         ("g8", "g8/retro", "anchormass_tiny_h8", {}), ("late", "late/retro", "anchormass_tiny_h8", {})]


def write_run(folder, preset: str, changes: dict, finished: bool, init_from=None, losses=(0.9, 0.5)):
    """A run folder as train.py leaves it: last checkpoint, result record, start record, CSV log."""
    cfg = load_model_config(preset).replace(vocab_size=VOCAB, **changes)
    torch.manual_seed(0)
    model = build_model(cfg)
    (folder / "checkpoints").mkdir(parents=True)
    torch.save({"state_dict": {STATE_PREFIX + k: v for k, v in model.state_dict().items()},
                "hyper_parameters": {"model_config": cfg.to_dict()}}, folder / "checkpoints" / "last.ckpt")
    steps = 2 * len(losses)
    (folder / "train_result.json").write_text(json.dumps(
        {"completed": finished, "global_step": steps if finished else 1, "total_steps": steps}))
    (folder / "stage_args.json").write_text(json.dumps({"args": [], "init_from": init_from}))
    (folder / "logs").mkdir()
    rows = "".join(f"{2 * i + 1},{v}\n" for i, v in enumerate(losses))
    (folder / "logs" / "metrics.csv").write_text("step,val/loss\n" + rows)


@pytest.fixture(scope="module")
def seed_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("retrofit") / "seed0"
    write_run(root / "std" / "pre", "standard_tiny_h8", {}, True, losses=(1.5, 1.2))
    write_run(root / "std" / "long", "standard_tiny_h8", {}, True,
              init_from=str(root / "std" / "pre" / "checkpoints" / "last.ckpt"))
    for label, run, preset, changes in CELLS[1:]:
        write_run(root / run, preset, changes, finished=label != "late",
                  init_from=str(root / "std" / "long" / "checkpoints" / "last.ckpt"))
    return root


def test_every_finished_cell_is_scored_on_the_same_trials(assets, seed_folder, tmp_path):  # noqa: F811
    cells = ",".join(f"{{label:{label},run:{run},shape:tiny_h8,tags:[frontier]}}" for label, run, _, _ in CELLS)
    out = run_evaluation(compose_cfg(
        "suite=retrofit", "eval=retrofit", f"ckpt={seed_folder / 'std' / 'long' / 'checkpoints' / 'last.ckpt'}",
        f"eval.retrofit.cells=[{cells}]", "eval.retrofit.lengths=[160,320]", "eval.retrofit.trained_length=160",
        "eval.retrofit.depths=[0.5]", "eval.retrofit.seeds=[0,1]", "eval.retrofit.max_new_tokens=4",
        *common(assets, tmp_path / "out")))
    res = json.loads((out / "results.json").read_text())["suites"]["retrofit"]
    assert res["labels"] == ["std", "g1", "g8"] and res["left_out"] == ["late"]
    trials = {lab: sorted((i["length"], i["depth"], i["seed"]) for i in res["items"] if i["model"] == lab)
              for lab in res["labels"]}
    assert trials["std"] == trials["g1"] == trials["g8"] and len(trials["std"]) == 4
    nbytes = res["stored_bytes"]
    assert nbytes["std"] > nbytes["g1"] > nbytes["g8"] > 0  # full K/V > lossless slots > 8:1 slots
    assert res["models"]["g8"]["group_size"] == 8 and res["models"]["std"]["group_size"] is None
    # g1's curve runs through its own stage only (its start is another model's run), the Standard's
    # through both of its stages, steps counted from the chain's first stage
    assert [p["stage"] for p in res["curves"]["g1"]] == ["retro", "retro"]
    assert [(p["stage"], p["step"]) for p in res["curves"]["std"]] == [("pre", 2), ("pre", 4), ("long", 6), ("long", 8)]
    assert len(res["probe"]["g8"]) == load_model_config("anchormass_tiny_h8").n_layers
    assert "late" in (out / "report.md").read_text()
