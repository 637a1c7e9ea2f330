"""The project deletes only files it can prove it wrote (issue 46; anchormass/own_files.py): a
record of the names written, kept in the folder written to; never through a link out of the folder
being cleaned. One test per place that deletes (docs/architecture.md, "What the project deletes")."""

import os

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from anchormass.errors import ConfigError
from anchormass.eval import runner
from anchormass.own_files import RECORD, STAGING_MARK, foreign, record
from anchormass.runs.resume_point import make_last_the_newest
from anchormass.runs.run_dir import claim, release
from anchormass.runs.train import clean_before_resume
from anchormass.training.checkpoint import AtomicCheckpointIO

from _train_helpers import CONFIG_DIR


def evaluate_config(out_dir, *extra):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose("evaluate", overrides=["suite=profile", "model=standard_tiny", f"out_dir={out_dir}",
                                              "progress=false", "eval=cpu_tiny", *extra])


def tree(folder) -> dict:
    """Every file under `folder` (links not followed) with its bytes: what must stay untouched."""
    return {os.path.relpath(os.path.join(base, name), folder): open(os.path.join(base, name), "rb").read()
            for base, _, files in os.walk(folder) for name in files}


def fake_checkpoint(path, step: int, ours: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if ours:
        record(path.parent, [path.name])
    torch.save({"global_step": step}, path)


@pytest.fixture
def no_model_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("models were loaded before the out_dir was checked")

    monkeypatch.setattr(runner, "load_models", refuse)


# -- evaluate.py out_dir=... overwrite=true (eval/runner.py)

def test_overwrite_refuses_the_current_folder_before_loading_and_deletes_nothing(tmp_path, monkeypatch,
                                                                                  no_model_loading):
    """Before: out_dir=. overwrite=true deleted every file and folder of the current folder, then crashed."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "model.py").write_text("weights = 1\n")
    (tmp_path / "README.md").write_text("mine\n")
    before = tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"is not the output of an evaluation \(overwrite=true replaces only"):
        runner.run_evaluation(evaluate_config(".", "overwrite=true"))
    assert tree(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["README.md", "src"]


def test_overwrite_refuses_a_training_run_folder_and_its_checkpoints_folder(tmp_path, no_model_loading):
    """Before: out_dir=<run folder> overwrite=true exited 0 with the run's checkpoints gone."""
    run = tmp_path / "run"
    fake_checkpoint(run / "checkpoints" / "last.ckpt", 2, ours=True)
    (run / "train_result.json").write_text("{}")
    before = tree(run)
    for out in (run, run / "checkpoints"):   # the checkpoints folder has a record, but of checkpoints
        with pytest.raises(ConfigError, match="is not the output of an evaluation"):
            runner.run_evaluation(evaluate_config(out, "overwrite=true"))
    assert tree(run) == before


def test_overwrite_replaces_an_evaluation_output_and_nothing_a_user_added(tmp_path):
    out = tmp_path / "eval"
    small = ["eval.profile.lengths=[16]", "eval.profile.warmup=0", "eval.profile.repeats=1",
             "eval.profile.decode_tokens=1"]
    runner.run_evaluation(evaluate_config(out, *small))
    assert RECORD in os.listdir(out) and not foreign(out)   # every file it wrote is recorded
    (out / "results.json").write_text("{}")
    runner.run_evaluation(evaluate_config(out, *small, "overwrite=true"))
    assert (out / "results.json").read_text() != "{}" and not foreign(out)   # replaced
    (out / "notes.txt").write_text("my reading of the table\n")
    with pytest.raises(ConfigError, match=r"holds files no evaluation wrote \(notes.txt\)"):
        runner.run_evaluation(evaluate_config(out, "overwrite=true"))
    assert (out / "notes.txt").is_file()
    link = tmp_path / "link"
    link.symlink_to(out)
    with pytest.raises(ConfigError, match="is a symbolic link"):
        runner.run_evaluation(evaluate_config(link, "overwrite=true"))


def test_a_staging_folder_is_removed_only_when_it_is_ours(tmp_path, no_model_loading):
    out, staging = tmp_path / "eval", tmp_path / ".eval.partial"
    staging.mkdir()
    (staging / "thesis.tex").write_text("not ours\n")
    with pytest.raises(ConfigError, match="is not a staging folder of ours"):
        runner.run_evaluation(evaluate_config(out))
    assert (staging / "thesis.tex").is_file()
    (staging / "thesis.tex").unlink()
    (staging / STAGING_MARK).write_bytes(b"")
    (staging / "results.json").write_text("{half")   # what a killed evaluation left
    runner._publish(out, lambda folder: (folder / "results.json").write_text("{}"))
    assert not staging.exists() and sorted(os.listdir(out)) == [RECORD, "results.json"]


# -- a resume's clean-up (runs/train.py: clean_before_resume, resume_point.py)

def resume_config(run, keep: int):
    return OmegaConf.create({"output_dir": str(run), "ckpt_path": None,
                             "callbacks": {"model_checkpoint": {"dirpath": None, "save_top_k": keep}}})


def test_a_resume_removes_only_its_own_extra_checkpoints_and_temp_files(tmp_path):
    """Before: every .ckpt beyond the kept count and every *.tmp went, whatever its name."""
    ckpts = tmp_path / "run" / "checkpoints"
    for step in (1, 2, 3):
        fake_checkpoint(ckpts / f"step-{step:07d}.ckpt", step, ours=True)
    fake_checkpoint(ckpts / "last.ckpt", 3, ours=True)
    fake_checkpoint(ckpts / "backup_step2.ckpt", 2, ours=False)
    (ckpts / "notes.tmp").write_text("a user's notes\n")
    (ckpts / ".last.ckpt.x1y2.tmp").write_bytes(b"half a checkpoint")   # our killed write
    clean_before_resume(resume_config(ckpts.parent, keep=1), str(ckpts / "last.ckpt"))
    assert sorted(os.listdir(ckpts)) == [RECORD, "backup_step2.ckpt", "last.ckpt", "notes.tmp", "step-0000003.ckpt"]


def test_a_resume_deletes_nothing_through_a_linked_checkpoints_folder(tmp_path):
    """Before: it removed a user's backup_step2.ckpt and notes.tmp outside the runs root."""
    elsewhere = tmp_path / "elsewhere"
    for step in (1, 2):
        fake_checkpoint(elsewhere / f"step-{step:07d}.ckpt", step, ours=True)
    fake_checkpoint(elsewhere / "last.ckpt", 2, ours=True)
    fake_checkpoint(elsewhere / "backup_step2.ckpt", 2, ours=False)
    (elsewhere / "notes.tmp").write_text("a user's notes\n")
    (elsewhere / ".step-0000001.ckpt.a1b2.tmp").write_bytes(b"x")
    run = tmp_path / "runs" / "run"
    run.mkdir(parents=True)
    (run / "checkpoints").symlink_to(elsewhere)
    before = tree(elsewhere)
    clean_before_resume(resume_config(run, keep=0), str(run / "checkpoints" / "last.ckpt"))
    assert tree(elsewhere) == before


def test_an_old_last_copy_goes_only_when_ours(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for name in ("step-0000004.ckpt", "last.ckpt"):
        fake_checkpoint(ckpts / name, 4, ours=True)
    fake_checkpoint(ckpts / "last-v1.ckpt", 2, ours=True)
    fake_checkpoint(ckpts / "last-v2.ckpt", 2, ours=False)
    make_last_the_newest(ckpts, ckpts / "step-0000004.ckpt")
    assert sorted(os.listdir(ckpts)) == [RECORD, "last-v2.ckpt", "last.ckpt", "step-0000004.ckpt"]


def test_lightnings_rotation_removes_only_recorded_checkpoints(tmp_path):
    fake_checkpoint(tmp_path / "step-0000001.ckpt", 1, ours=True)
    fake_checkpoint(tmp_path / "step-0000002.ckpt", 2, ours=False)
    io = AtomicCheckpointIO()
    io.remove_checkpoint(tmp_path / "step-0000001.ckpt")
    io.remove_checkpoint(tmp_path / "step-0000002.ckpt")
    assert sorted(os.listdir(tmp_path)) == [RECORD, "step-0000002.ckpt"]
    (tmp_path / "step-0000001.ckpt").write_bytes(b"a user's copy, put back")   # its name was forgotten
    io.remove_checkpoint(tmp_path / "step-0000001.ckpt")
    assert (tmp_path / "step-0000001.ckpt").is_file()


# -- a fresh run, overwrite=true (runs/run_dir.py: claim)

def test_a_fresh_run_clears_only_what_our_runs_wrote(tmp_path):
    run = tmp_path / "run"
    claim(run, resume=False, overwrite=False)   # a first run claims the folder: its outputs are recorded
    release(run)
    fake_checkpoint(run / "checkpoints" / "last.ckpt", 2, ours=True)
    (run / "train_result.json").write_text("{}")
    (run / "logs").mkdir()
    (run / "logs" / "metrics.csv").write_text("step\n")
    claim(run, resume=False, overwrite=True)
    release(run)
    assert sorted(os.listdir(run)) == [RECORD]

    fake_checkpoint(run / "checkpoints" / "last.ckpt", 2, ours=True)
    (run / "checkpoints" / "paper_figure.ckpt").write_bytes(b"a user's file")
    with pytest.raises(ConfigError, match=r"holds checkpoints/paper_figure.ckpt, which no run of this project"):
        claim(run, resume=False, overwrite=True)
    assert sorted(os.listdir(run / "checkpoints")) == [RECORD, "last.ckpt", "paper_figure.ckpt"]

    elsewhere = tmp_path / "elsewhere"
    fake_checkpoint(elsewhere / "last.ckpt", 2, ours=True)
    (run / "checkpoints").rename(tmp_path / "moved")
    (run / "checkpoints").symlink_to(elsewhere)
    claim(run, resume=False, overwrite=True)   # the link goes, never what it points to
    release(run)
    assert not (run / "checkpoints").exists() and (elsewhere / "last.ckpt").is_file()


def test_a_fresh_run_into_a_folder_that_was_never_a_run_deletes_nothing(tmp_path):
    """`hydra.run.dir=.` in a project of one's own: its logs/ and wandb/ are not a run's outputs."""
    home = tmp_path / "home"
    (home / "logs").mkdir(parents=True)
    (home / "logs" / "lab_notebook.md").write_text("mine\n")
    (home / "wandb").mkdir()
    before = tree(home)
    with pytest.raises(ConfigError, match=r"holds logs, wandb, which no run of this project recorded writing"):
        claim(home, resume=False, overwrite=True)
    assert tree(home) == before
