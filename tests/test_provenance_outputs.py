"""The project's own output folders never make a result "-dirty" (issue 24: the README's
`out=exports/...` marked every later result dirty); code outside them still does."""

import subprocess

import pytest

from anchormass.utils import git_commit, git_state

GIT = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]


@pytest.fixture
def repo(tmp_path):
    subprocess.run(GIT + ["init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    subprocess.run(GIT + ["-C", str(tmp_path), "add", "a.py"], check=True)
    subprocess.run(GIT + ["-C", str(tmp_path), "commit", "-qm", "a"], check=True)
    return tmp_path


def write(path, text="{}\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("files", [
    ["exports/my_model/config.json", "exports/my_model/anchormass_export.json", "exports/my_model/tokenizer.json"],
    ["runs/default/anchormass_tiny/pretrain_1k/.hydra/config.yaml", "runs/x/train_result.json"],
    ["multirun/default/pretrain_1k/0/.hydra/overrides.yaml", "outputs/2026-01-01/.hydra/hydra.yaml"],
    ["data/mine/meta.json", "data/mine/train.bin.json"],
    # the same outputs written wherever they were pointed: recognised by the files they hold
    ["my_exports/m1/config.json", "my_exports/m1/anchormass_export.json"],
    ["scratch/run1/.hydra/config.yaml", "scratch/run1/train_result.json"],
    ["evals/e1/results.json", "evals/e1/plots/meta.json"],
    ["corpora/ja/meta.json", "corpora/ja/val.bin.json"],
])
def test_project_outputs_leave_the_tree_clean(repo, files):
    for name in files:
        write(repo / name)
    state = git_state(repo)
    assert state["dirty"] is False, state
    assert not git_commit(repo).endswith("-dirty")


def test_code_beside_or_inside_ordinary_folders_is_still_dirty(repo):
    write(repo / "exports_notes" / "helper.py", "y = 2\n")   # not an output folder: no marker file
    state = git_state(repo)
    assert state["dirty"] is True and state["untracked_source"] == ["exports_notes/helper.py"]


def test_code_version_names_the_install_where_there_is_no_checkout():
    import anchormass
    from anchormass.utils import code_version

    assert code_version(None) == f"anchormass {anchormass.__version__} (installed, no checkout)"
    assert code_version() == git_commit()  # in a checkout: the commit
