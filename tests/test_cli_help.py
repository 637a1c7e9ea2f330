"""`--help` of every entry point (issue 36): answered without importing torch or Lightning (before:
~6 s, now well under the 3 s asked for), listing the choices that entry point reads (suites for
evaluate.py, presets per group) and not the groups it ignores."""

import subprocess
import sys

import pytest

from _train_helpers import REPO, subprocess_env

# entry point: (named in its help, groups it must not list)
ENTRY_POINTS = {
    "train.py": (["model ", "standard_tiny", "stage ", "pretrain_1k", "trainer ", "ddp_cpu", "optuna_optim",
                  "ckpt_path=null"], ["curriculum ", "suite "]),
    "evaluate.py": (["suite ", "passkey", "lm_eval", "eval ", "cpu_tiny", "compare_model", "out_dir=null"],
                    ["curriculum ", "stage ", "trainer "]),
    "scripts/prepare_data.py": (["data ", "aozora", "demo_chat"], ["model ", "curriculum ", "trainer "]),
    "scripts/run_curriculum.py": (["curriculum ", "mini", "trainer ", "runs_root=runs"], ["suite ", "data "]),
    "scripts/export_hf.py": (["format ", "llama", "ckpt=null", "out=null"], ["model ", "data ", "curriculum "]),
    "scripts/import_hf.py": (["src=null", "out=null", "global_groups=null"], ["model ", "data ", "curriculum "]),
}


@pytest.mark.parametrize("script", list(ENTRY_POINTS))
def test_help_is_fast_and_lists_what_the_entry_point_reads(script):
    proc = subprocess.run([sys.executable, "-X", "importtime", script, "--help"], cwd=REPO, env=subprocess_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert not {"torch", "lightning", "datasets"} & imported   # before: train.py --help imported both (~6 s)
    listed = [line.strip() for line in proc.stdout.splitlines()]
    named, ignored = ENTRY_POINTS[script]
    for text in named:
        assert text in proc.stdout, (text, proc.stdout)
    for group in ignored:
        assert not any(line.startswith(group) for line in listed), (group, proc.stdout)
    assert "-sc install=bash" in proc.stdout
