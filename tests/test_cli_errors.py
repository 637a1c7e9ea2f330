"""Bad input on the command line: one `error:` line naming the key or path (and what to write
instead), exit code 2, no traceback, nothing written (issue 24). Each case runs the real entry
point in a subprocess; all of them stop before any training or evaluation starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _train_helpers import FAST, REPO, subprocess_env, tiny_datasets


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_datasets(tmp_path_factory.mktemp("cli_errors_data"))


def files_under(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")} if folder.exists() else set()


def run(script: str, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, script, *args], cwd=REPO, env=subprocess_env(), capture_output=True,
                          text=True, timeout=300)


def assert_one_line(proc: subprocess.CompletedProcess, *named: str) -> None:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and proc.stderr.strip() == errors[0], proc.stderr[-3000:]
    for text in named:
        assert text in errors[0], errors[0]


TRAIN_CASES = {
    # override: what the one line must name
    "stage.lr=fast": ["stage.lr must be a number", "'fast'"],
    "optim.lr=fast": ["optim.lr must be a number"],
    "stage.total_steps=-5": ["stage.total_steps must be >= 1", "-5"],
    "stage.val_every=0": ["stage.val_every must be >= 1"],          # was a ZeroDivisionError
    "stage.total_steps=20.7": ["stage.total_steps must be a whole number", "20.7"],   # was silently 20
    "stage.ckpt_every=0": ["stage.ckpt_every must be >= 1"],        # was silently no checkpoints
    "optim.weight_decay=-0.1": ["optim.weight_decay must be >= 0"],
    "stage.totl_steps=5": ["unknown key stage.totl_steps", "did you mean stage.total_steps?", "+stage.totl_steps="],
    "hydra/launcher=submitit_locl": ["unknown hydra/launcher 'submitit_locl'", "submitit_local"],
    "hydra/sweeper=optuna_optm": ["unknown hydra/sweeper 'optuna_optm'", "optuna_optim"],
    # the key the user set, not the optim key that follows it (issue 36); was refused inside the run
    "stage.warmup_steps=3": ["stage.warmup_steps=3 must be in [0, stage.total_steps=2]"],
    "optim.warmup_steps=3": ["optim.warmup_steps=3 must be in [0, stage.total_steps=2]"],
    "data_dir=no/such/data": ["no prepared data folder no/such/data"],   # left .hydra/ and train.log behind
    "init_from=no/such.ckpt": ["init_from checkpoint not found: no/such.ckpt"],
}
if not torch.cuda.is_available():   # was a 31-line traceback, exit 1, and a run folder left behind
    TRAIN_CASES["trainer=gpu"] = ["trainer=gpu needs a CUDA GPU", "use trainer=cpu"]
    TRAIN_CASES["trainer=ddp"] = ["trainer=ddp needs a CUDA GPU", "trainer=ddp_cpu"]


@pytest.mark.parametrize("bad", list(TRAIN_CASES))
def test_train_refuses_in_one_line_and_writes_nothing(data, tmp_path, bad):
    out = tmp_path / "run"
    proc = run("train.py", [f"data_dir={data['pretrain']}", *FAST, bad, f"hydra.run.dir={out}"])
    assert_one_line(proc, *TRAIN_CASES[bad])
    assert not out.exists()


def test_a_sweep_checks_every_value_before_its_first_job(data, tmp_path):
    out = tmp_path / "sweep"
    proc = run("train.py", ["-m", f"data_dir={data['pretrain']}", *FAST, "stage.val_every=2,0",
                            f"hydra.sweep.dir={out}"])
    assert_one_line(proc, "stage.val_every must be >= 1, got 0")
    assert not out.exists()  # not even job 0 ran


def test_a_rerun_through_a_launcher_is_refused_before_submitting(data, tmp_path):
    """Before: submitit's 30-line UncompletedJobError (exit 1) wrapped the job's own line."""
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "last.ckpt").write_bytes(b"an earlier run's checkpoint")
    before = files_under(out)
    proc = run("train.py", [f"data_dir={data['pretrain']}", *FAST, "hydra/launcher=submitit_local",
                            f"hydra.run.dir={out}"])
    assert_one_line(proc, f"{out} already holds another run's checkpoints", "ckpt_path=last", "overwrite=true")
    assert files_under(out) == before  # no .submitit/, .hydra/ or multirun.yaml


def test_prepare_data_names_the_missing_tokenizer_key(tmp_path):
    raw = tmp_path / "alpaca.json"
    raw.write_text(json.dumps([{"instruction": "a", "input": "", "output": "b"}]))
    out = tmp_path / "alpaca"
    proc = run("scripts/prepare_data.py", ["data=alpaca", f"data.source.paths=[{raw}]", f"data.out_dir={out}"])
    # was: tokenizer not found: .../???
    assert_one_line(proc, "data.tokenizer.path is required", "data.tokenizer.path=")
    assert not out.exists()


@pytest.mark.parametrize("script, args, named", [
    ("scripts/prepare_data.py", ["data=demo", "data.tokenizr.vocab_size=100"],
     ["unknown key data.tokenizr.vocab_size", "did you mean data.tokenizer?"]),
    ("evaluate.py", ["suite=ppl", "eval.ppl.contxts=[0]"],
     ["unknown key eval.ppl.contxts", "did you mean eval.ppl.contexts?"]),
    # these six used to print Hydra's four-line message and exit 1
    ("scripts/run_curriculum.py", ["curriculum.paralel=2"],
     ["unknown key curriculum.paralel", "did you mean curriculum.parallel?"]),
    ("scripts/bench.py", ["threds=1"], ["unknown key threds", "did you mean threads?"]),
    ("scripts/export_hf.py", ["fromat=llama"], ["unknown key fromat", "did you mean format?"]),
    ("scripts/recall_probe.py", ["stepz=5"], ["unknown key stepz", "did you mean steps?"]),
    ("scripts/bench_data.py", ["min_m=1"], ["unknown key min_m", "did you mean min_mb?"]),
    ("scripts/merge_data.py", ["shard=[a]"], ["unknown key shard", "did you mean shards?"]),
    ("scripts/import_hf.py", ["scr=x.gguf"], ["unknown key scr", "did you mean src?"]),
])
def test_unknown_keys_of_the_other_entry_points(tmp_path, script, args, named):
    proc = run(script, [*args, f"out_dir={tmp_path / 'o'}"] if script == "evaluate.py" else args)
    assert_one_line(proc, *named)
    assert not (tmp_path / "o").exists()


lm_eval_cases = pytest.mark.skipif(subprocess.run([sys.executable, "-c", "import lm_eval"]).returncode != 0,
                                   reason="needs lm-evaluation-harness")


@pytest.mark.slow  # the harness indexes its thousands of task files (~15 s)
@lm_eval_cases
@pytest.mark.parametrize("task, named", [
    ("unknown", ["unknown lm_eval task 'unknown'", "lm_eval ls tasks", "jcqa_local"]),
    # a hub-only task with the hub out of reach (conftest sets HF_DATASETS_OFFLINE=1)
    ("arc_easy", ["arc_easy", "could not be fetched from the Hugging Face Hub", "jcqa_local"]),
])
def test_lm_eval_task_problems_are_one_line(data, tmp_path, task, named):
    out = tmp_path / "eval"
    proc = run("evaluate.py", ["suite=lm_eval", f"tasks=[{task}]", "model=anchormass_tiny", "model.vocab_size=400",
                               f"tokenizer={data['pretrain'] / 'tokenizer.model'}", "eval.lm_eval.limit=2",
                               "progress=false", f"out_dir={out}"])
    assert_one_line(proc, *named)
    assert not out.exists() and not list(tmp_path.glob(".*partial"))


def test_hydra_flags_still_reach_hydra(data):
    """The checks compose the config themselves; Hydra's own flags (`--cfg job`) are left to it."""
    proc = run("train.py", ["--cfg", "job", f"data_dir={data['pretrain']}", "stage.total_steps=3"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "total_steps: 3" in proc.stdout
