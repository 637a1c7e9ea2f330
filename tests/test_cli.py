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


@pytest.mark.parametrize("script", ["train.py", "evaluate.py", "scripts/prepare_data.py"])
def test_every_entry_point_checks_before_hydra(script):
    proc = subprocess.run([sys.executable, script, "data=no_such_dataset"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "unknown data 'no_such_dataset'" in proc.stderr


def test_run_curriculum_refuses_bad_parallel_before_any_work(tmp_path):
    proc = subprocess.run([sys.executable, "scripts/run_curriculum.py", "parallel=two", f"runs_root={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "error: parallel must be a whole number of models, got 'two'"
    assert not any(tmp_path.iterdir())


def test_run_curriculum_refuses_a_comparison_of_one_model_before_any_work(tmp_path):
    proc = subprocess.run([sys.executable, "scripts/run_curriculum.py", "models=standard_tiny",
                           f"runs_root={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().startswith("error: the closing comparison needs two models")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())
