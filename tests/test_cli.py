"""Entry points refuse unknown config-group choices in one line with exit code 2."""

import subprocess
import sys
from pathlib import Path

import pytest

from anchormass.cli import check_group_choices

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def test_known_choices_sweeps_and_non_group_overrides_pass():
    check_group_choices(CONFIGS, ["model=anchormass_tiny", "model=standard_tiny,anchormass_tiny", "optim.lr=1e-3",
                                  "suite=[ppl,passkey]", "model=/some/path.yaml", "+stage=warmup_4k", "-m"])


def test_unknown_choice_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        check_group_choices(CONFIGS, ["stage=pretrain_1k", "model=standard_tiny,anchormas_tiny"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown model 'anchormas_tiny'") and "\n" not in err


@pytest.mark.parametrize("script", ["train.py", "evaluate.py", "scripts/prepare_data.py", "scripts/run_curriculum.py",
                                    "scripts/bench.py", "scripts/recall_probe.py"])
def test_every_entry_point_checks_before_hydra(script):
    proc = subprocess.run([sys.executable, script, "data=no_such_dataset"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "unknown data 'no_such_dataset'" in proc.stderr


def test_search_path_folders_hold_group_choices_too(tmp_path):
    (tmp_path / "curriculum").mkdir()
    (tmp_path / "curriculum" / "mine.yaml").write_text("name: mine\n")
    check_group_choices(CONFIGS, [f"hydra.searchpath=[file://{tmp_path}]", "curriculum=mine"])
    with pytest.raises(SystemExit):
        check_group_choices(CONFIGS, ["curriculum=mine"])


def run_curriculum(*overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/run_curriculum.py", *overrides], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("overrides, message", [
    (["curriculum.parallel=two"], "error: curriculum.parallel must be a whole number of models >= 1, got 'two'"),
    (["verbose=3"], "error: verbose must be 0 (quiet), 1 (default) or 2 (everything), got 3"),
    (["evaluate=maybe"], "error: evaluate must be true or false, got 'maybe'"),
    (["curriculum=nope"], "error: unknown curriculum 'nope'; choose one of: ablations, full_158m, mini, recall_study, "
                          "retrofit, retrofit_smollm2"),
    (["curriculum.models=[standard_tiny]"], "error: the closing comparison needs two models, got "
                                            "curriculum.models=[standard_tiny]; pass two models or evaluate=false"),
])
def test_run_curriculum_refuses_bad_options_in_one_line_before_any_work(tmp_path, overrides, message):
    proc = run_curriculum(*overrides, f"runs_root={tmp_path}")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == message
    assert not any(tmp_path.iterdir())
