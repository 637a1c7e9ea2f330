"""A rerun of a changed recipe (anchormass/curriculum/changes.py): a finished or resumable stage
whose recorded config differs from the one the plan composes now is refused in one line naming the
keys, retrained with its descendants (old folders kept aside) or kept with a note; and a failed
stage's own error line comes first, with advice that works."""

import json

import pytest
from hydra import compose, initialize_config_dir

from anchormass.curriculum.changes import check_changes
from anchormass.curriculum.execute import StageRun, failure_text, stage_record
from anchormass.curriculum.stage_identity import identify
from anchormass.errors import ConfigError
from anchormass.runs.layout import STAGE_ARGS_FILE as ARGS_FILE
from anchormass.runs.run_settings import run_settings
from anchormass.utils import CONFIG_ROOT

ARGS = ["stage=pretrain_1k", "stage.total_steps=200", "stage.lr=0.001", "hydra.run.dir=/x", "logger=csv"]


def finished(folder, args, done=True):
    """A stage folder as execute.py leaves it, recorded as started with `args`."""
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"x")
    then = StageRun("m", "x", folder, None, list(args))
    identify([then])
    (folder / ARGS_FILE).write_text(json.dumps(stage_record(then)))
    (folder / "train_result.json").write_text(json.dumps({"completed": done, "global_step": 200 if done else 50,
                                                          "total_steps": 200}))


def chain(tmp_path, args_now):
    """a (finished) -> b (finished, from a) in one chain, and c of another model starting from b."""
    a = StageRun("m", "a", tmp_path / "m" / "a", None, list(args_now))
    b = StageRun("m", "b", tmp_path / "m" / "b", a.last_ckpt, ["stage=warmup_4k"])
    c = StageRun("n", "c", tmp_path / "n" / "c", b.last_ckpt, ["stage=longctx_8k"], after=b)
    finished(a.out_dir, ARGS)
    finished(b.out_dir, ["stage=warmup_4k"])
    return a, b, c


def test_display_keys_are_not_settings():
    with initialize_config_dir(config_dir=str(CONFIG_ROOT), version_base="1.3"):
        plain = run_settings(compose("train", overrides=ARGS))
        shown = run_settings(compose("train", overrides=ARGS + ["verbose=2", "logger=none", "torch_threads=2",
                                                               "++callbacks.progress_file._target_=x"]))
    assert shown == plain and plain["stage.total_steps"] == 200 and not any(k.startswith("hydra") for k in plain)


def test_the_thread_count_is_not_a_setting(tmp_path):
    """`curriculum.parallel` sets torch_threads on shared stages: a rerun on other cores is no change."""
    check_changes(list(chain(tmp_path, ARGS + ["torch_threads=2"])), "refuse")


def test_an_unchanged_recipe_and_a_new_run_pass(tmp_path):
    runs = chain(tmp_path, ARGS[:-1] + ["logger=none"])  # only the logger differs
    check_changes(list(runs), "refuse")


def test_a_changed_finished_stage_is_refused_in_one_line(tmp_path):
    runs = chain(tmp_path, ["stage=pretrain_1k", "stage.total_steps=400", "stage.lr=0.001", "model.group_size=2"])
    with pytest.raises(ConfigError, match=r"m/a does not match what the recipe gives now "
                                          r"\(model.group_size: \d+ -> 2; stage.total_steps: 200 -> 400\); "
                                          r"rerun with changed=retrain") as err:
        check_changes(list(runs), "refuse")
    assert "\n" not in str(err.value)
    assert all(r.out_dir.exists() for r in runs[:2])


def test_a_changed_resumable_stage_is_refused_too(tmp_path):
    a = StageRun("m", "a", tmp_path / "a", None, ["stage.lr=0.01"])
    finished(a.out_dir, ["stage.lr=0.001"], done=False)
    with pytest.raises(ConfigError, match="stage.lr: 0.001 -> 0.01"):
        check_changes([a], "refuse")


def test_retrain_sets_aside_the_stage_and_everything_after_it(tmp_path, capsys):
    a, b, c = chain(tmp_path, ["stage=pretrain_1k", "stage.total_steps=400", "stage.lr=0.001"])
    finished(c.out_dir, ["stage=longctx_8k"])
    check_changes([a, b, c], "retrain")
    for run in (a, b, c):
        assert not run.out_dir.exists()
        assert (run.out_dir.parent / f"{run.out_dir.name}.replaced-1" / "checkpoints" / "last.ckpt").is_file()
    assert capsys.readouterr().err.count("trains again") == 3


def test_keep_leaves_the_old_runs_and_names_them(tmp_path, capsys):
    a, b, c = chain(tmp_path, ["stage=pretrain_1k", "stage.total_steps=400", "stage.lr=0.001"])
    check_changes([a, b, c], "keep")
    assert a.is_done() and "note: keeping" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="changed must be one of refuse, retrain, keep"):
        check_changes([a], "maybe")


def test_a_refusal_shows_the_stages_own_error_first_with_advice_that_works(tmp_path):
    run = StageRun("m", "a", tmp_path, None)
    (tmp_path / "train.log").write_text("loading\nerror: cannot resume: stage.seq_len changed 512 -> 1024\n")
    text = failure_text(run, 2, 3.0)
    assert text.startswith("error: cannot resume: stage.seq_len changed 512 -> 1024 (exit 2")
    assert "rerun the same command to resume" not in text and "fix what it names" in text
    (tmp_path / "train.log").write_text("Traceback ...\nKilled\n")
    assert failure_text(run, 137, 3.0) == ("exit 137 after 3 s; rerun the same command to resume from the start of "
                                           "the stage")
