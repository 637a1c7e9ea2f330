"""A checkpoint is data, not code (issue 34): no file the project reads can run a command.

A crafted checkpoint whose pickle calls os.system (creating a marker file) is handed to every
entry point that reads one: the marker never appears, each command exits 2 with one line. The
curriculum's resume runs `train.py ckpt_path=<its last.ckpt>` / `init_from=<the parent's
last.ckpt>` (curriculum/plan.py; tests/test_train_curriculum.py checks those commands), so the
train.py routes below are its routes too. A checkpoint written by the real training path (a
resume with a changed setting included) loads with `weights_only=True` and no allow-list.
Names read from recipes and data configs cannot point outside the runs / data roots.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from anchormass.curriculum.recipe import load_recipe
from anchormass.data.prepare import prepare
from anchormass.errors import CheckpointError, ConfigError
from anchormass.runs.resume_point import latest_checkpoint, recorded_step
from anchormass.runs.train import train
from anchormass.training.checkpoint import AtomicCheckpointIO, atomic_torch_save, read_checkpoint
from anchormass.training.safe_load import UnsafeCheckpoint, safe_torch_load
from anchormass.training.strategies import SafeFSDPStrategy

from _train_helpers import FAST, REPO, compose_train, one_error_line, run_cli, train_cmd

MODEL = ["model=standard_tiny"]
SYSTEM = f"{os.system.__module__}.system"  # posix.system: how the pickle names os.system


class RunsACommand:
    """What an attacker pickles: unpickling it calls os.system (here: creates a marker file)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def crafted_checkpoint(path: Path, marker: Path) -> Path:
    """A file shaped like a training checkpoint whose hyper-parameters run a command when unpickled."""
    torch.save({"state_dict": {"model.w": torch.zeros(2)}, "global_step": 99,
                "hyper_parameters": {"model_config": RunsACommand(marker)}}, path)
    return path


def refusal(path: Path) -> str:
    return f"error: {path} holds Python objects that a checkpoint must not contain ({SYSTEM}); refusing to load it"


@pytest.fixture
def evil(tmp_path):
    marker = tmp_path / "MARKER"
    yield crafted_checkpoint(tmp_path / "evil.ckpt", marker), marker
    assert not marker.exists(), "the crafted checkpoint ran its command"


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    """A 2-step run resumed to step 3 with a changed setting (resume_overrides), so its checkpoints
    hold everything a resume writes; Lightning's restore went through AtomicCheckpointIO."""
    out = tmp_path_factory.mktemp("safety_run")
    over = [*MODEL, f"data_dir={data['pretrain']}", *FAST]
    train(compose_train(over, out))
    train(compose_train([*over, "stage.total_steps=3", "resume_overrides=[stage.total_steps]", "ckpt_path=last"], out))
    return out


# ------------------------------------------------------------------ our own checkpoints are data

def test_a_checkpoint_of_the_training_path_loads_weights_only_without_an_allow_list(trained):
    ckpts = sorted((trained / "checkpoints").glob("*.ckpt"))
    assert ckpts
    for path in ckpts:
        assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == []
        ckpt = torch.load(path, map_location="cpu", weights_only=True)  # torch's defaults, nothing added
        assert {"state_dict", "optimizer_states", "loops", "callbacks", "hyper_parameters"} <= set(ckpt)
    last = torch.load(trained / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == 3
    assert last["hyper_parameters"]["resume_overrides"][0]["key"] == "stage.total_steps"


# ------------------------------------------------------------------ a crafted file is refused

@pytest.mark.parametrize("route", ["evaluate ckpt", "evaluate compare_ckpt", "train init_from", "train ckpt_path",
                                   "train ckpt_path=last", "export_hf"])
def test_a_crafted_checkpoint_runs_nothing_and_is_refused_in_one_line(route, evil, data, trained, tmp_path):
    bad, _ = evil
    out = tmp_path / "out"
    train_over = [*MODEL, f"data_dir={data['pretrain']}", *FAST]
    good = trained / "checkpoints" / "last.ckpt"
    evaluate = [sys.executable, "evaluate.py", "suite=ppl", f"data_dir={data['pretrain']}", f"out_dir={out}",
                "progress=false"]
    if route == "train ckpt_path=last":  # merely placed in the run folder's checkpoints/
        (out / "checkpoints").mkdir(parents=True)
        shutil.copy(bad, out / "checkpoints" / "last.ckpt")
    cmd = {
        "evaluate ckpt": [*evaluate, f"ckpt={bad}"],
        "evaluate compare_ckpt": [*evaluate, f"ckpt={good}", f"compare_ckpt={bad}"],
        "train init_from": train_cmd([*train_over, f"init_from={bad}"], out),
        "train ckpt_path": train_cmd([*train_over, f"ckpt_path={bad}"], out),
        "train ckpt_path=last": train_cmd([*train_over, "ckpt_path=last"], out),
        "export_hf": [sys.executable, "scripts/export_hf.py", f"ckpt={bad}", f"out={out}"],
    }[route]
    proc = run_cli(cmd)
    line = one_error_line(proc)
    if route == "train ckpt_path=last":
        ckpt = out / "checkpoints" / "last.ckpt"
        assert (f"note: {ckpt} holds Python objects that a checkpoint must not contain ({SYSTEM}); ignored"
                in proc.stderr.splitlines())
        assert line == f"error: ckpt_path=last: no checkpoint in {out / 'checkpoints'}; start the run without " \
                       f"ckpt_path, or pass ckpt_path=<file>"
        assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["last.ckpt"]
    else:
        assert line == refusal(bad)
        assert not (out / "checkpoints").exists() and not (out / "results.json").exists()


def test_the_newest_step_scan_skips_an_unsafe_file_with_one_note(evil, trained, tmp_path, capsys):
    bad, _ = evil
    folder = tmp_path / "checkpoints"
    shutil.copytree(trained / "checkpoints", folder)
    shutil.copy(bad, folder / "step-9999999.ckpt")  # the highest step, if its content were read
    assert latest_checkpoint(folder) == folder / "last.ckpt"
    notes = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("note:")]
    assert notes == [f"note: {folder / 'step-9999999.ckpt'} holds Python objects that a checkpoint must not "
                     f"contain ({SYSTEM}); ignored"]
    assert recorded_step(folder / "step-9999999.ckpt") is None


def test_lightnings_restore_reads_with_the_weights_only_unpickler(evil):
    bad, _ = evil
    with pytest.raises(UnsafeCheckpoint, match="refusing to load it"):
        AtomicCheckpointIO().load_checkpoint(bad)  # what trainer.fit(ckpt_path=...) calls
    with pytest.raises(UnsafeCheckpoint, match="refusing to load it"):
        SafeFSDPStrategy().load_checkpoint(bad)  # FSDP's own full-checkpoint reader ignores weights_only


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_a_raw_pickle_in_torchs_old_format_is_refused_naming_its_global(protocol, tmp_path):
    marker = tmp_path / "MARKER"
    path = tmp_path / "old_format.ckpt"
    path.write_bytes(pickle.dumps(RunsACommand(marker), protocol=protocol))
    for mmap in (False, True):  # the scan maps files; an old-format one is read whole, still safely
        with pytest.raises(UnsafeCheckpoint) as err:
            safe_torch_load(path, mmap=mmap)
        assert err.value.offending == SYSTEM
    assert not marker.exists()


def test_an_unreadable_file_is_not_called_unsafe(tmp_path):
    path = tmp_path / "noise.ckpt"
    path.write_bytes(np.random.default_rng(0).bytes(4000))
    with pytest.raises(CheckpointError, match="cannot read checkpoint") as err:
        safe_torch_load(path)
    assert not isinstance(err.value, UnsafeCheckpoint)


# ------------------------------------------------------------------ converting an old checkpoint

def old_style_checkpoint(trained: Path, path: Path) -> dict:
    """last.ckpt as an earlier version of the project could have written it: a DictConfig and a
    Path in the hyper-parameters, numpy values in the RNG callback's state."""
    ckpt = torch.load(trained / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    hp = ckpt["hyper_parameters"]
    hp["optim"] = OmegaConf.create(hp["optim"])
    hp["tokenizer_path"] = Path(hp["tokenizer_path"])
    kind, keys, pos, has_gauss, gauss = ckpt["callbacks"]["RngState"]["numpy"]
    ckpt["callbacks"]["RngState"]["numpy"] = (kind, keys.numpy(), np.int64(pos), has_gauss, np.float64(gauss))
    atomic_torch_save(ckpt, path)
    return ckpt


def test_convert_checkpoint_needs_trust_and_makes_an_old_checkpoint_safe(data, trained, tmp_path):
    path = tmp_path / "old.ckpt"
    old = old_style_checkpoint(trained, path)
    with pytest.raises(UnsafeCheckpoint):
        read_checkpoint(path)
    script = [sys.executable, str(REPO / "scripts" / "convert_checkpoint.py")]
    assert "UNPICKLES" in " ".join(run_cli([*script, "--help"]).stdout.split())
    before = path.read_bytes()
    refused = run_cli([*script, f"out={path}"])  # no trust=: nothing is read
    assert refused.returncode == 2 and "trust=<file> is required" in refused.stderr and path.read_bytes() == before
    assert refused.stderr.count("\n") == 1

    done = subprocess.run([*script, f"trust={path}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "DictConfig" in done.stdout and "numpy.ndarray" in done.stdout and "PosixPath" in done.stdout
    new = read_checkpoint(path)  # the safe reader, content checksum verified
    assert new["hyper_parameters"]["optim"] == OmegaConf.to_container(old["hyper_parameters"]["optim"])
    assert new["hyper_parameters"]["tokenizer_path"] == str(old["hyper_parameters"]["tokenizer_path"])
    assert all(torch.equal(new["state_dict"][k], v) for k, v in old["state_dict"].items())
    assert not list(tmp_path.glob("*.tmp"))
    # and it resumes: Lightning restores the RNG state from the converted tensors
    result = train(compose_train([*MODEL, f"data_dir={data['pretrain']}", *FAST, "stage.total_steps=3",
                                  f"ckpt_path={path}"], tmp_path / "resumed"))
    assert result["global_step"] == 3


def test_convert_checkpoint_refuses_what_has_no_plain_equivalent(trained, tmp_path):
    from anchormass.training.convert_checkpoint import convert_trusted

    ckpt = torch.load(trained / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    ckpt["hyper_parameters"]["fn"] = len  # a function: no plain value stands for it
    path = tmp_path / "odd.ckpt"
    atomic_torch_save(ckpt, path)
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match="builtins.len, which has no plain equivalent"):
        convert_trusted(path)
    assert path.read_bytes() == before and not list(tmp_path.glob(".*.tmp"))


# ------------------------------------------------------------------ names that become folders

@pytest.mark.parametrize("change", [{"name": "../../escaped"}, {"name": "/tmp/escaped"},
                                    {"models": ["standard_tiny", "../escaped"]},
                                    {"stages": {"../../../escaped": {"data": "demo"}}}])
def test_recipe_names_that_leave_the_runs_root_are_refused(change):
    cfg = OmegaConf.merge(OmegaConf.load(REPO / "configs" / "curriculum" / "mini.yaml"), change)
    with pytest.raises(ConfigError, match="must be a plain folder name") as err:
        load_recipe(cfg)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("change", [{"name": "../escaped"}, {"out_dir": "data/../../escaped"},
                                    {"out_dir": "runs/escaped"}])
def test_data_configs_that_leave_the_data_root_are_refused_before_writing(change, tmp_path):
    cfg = {"name": "x", "kind": "pretrain", "out_dir": str(tmp_path / "x"), "source": {"kind": "demo"}, **change}
    with pytest.raises(ConfigError, match="plain folder name|points outside the data root"):
        prepare(cfg)
    assert not (REPO / "escaped").exists() and not (REPO.parent / "escaped").exists()
    assert not (REPO / "runs" / "escaped").exists()


def test_prepare_data_refuses_an_out_dir_outside_data_in_one_line(tmp_path):
    proc = run_cli([sys.executable, "scripts/prepare_data.py", "data=demo", "data.out_dir=../escaped"])
    assert one_error_line(proc) == ("error: data.out_dir=../escaped points outside the data root: give a folder "
                                    "under data/ (or an absolute path without '..')")
