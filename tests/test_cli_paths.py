"""Any path a user gives an entry point (spaces, non-ASCII, a parent that does not exist yet, a
read-only place or one under a file) gives a working run or one `error:` line with exit 2, never
a traceback (issue 37). One property over path kinds x entry points; the refusals happen before
any work, and each working case is the smallest real run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from _train_helpers import REPO, compose_train, subprocess_env, tiny_datasets

TINY = ["stage.seq_len=64", "stage.total_steps=1", "stage.global_batch_size=2", "stage.micro_batch_size=2",
        "stage.warmup_steps=0", "stage.val_every=1", "stage.val_batches=1", "stage.ckpt_every=1",
        "stage.datamodule.num_workers=0", "logger=none", "trainer.enable_progress_bar=false", "torch_threads=1"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict:
    from anchormass.runs.train import train

    base = tmp_path_factory.mktemp("cli_paths")
    data = tiny_datasets(base / "data")["pretrain"]
    run = base / "run"
    train(compose_train(["model=standard_tiny", f"data_dir={data}", *TINY], run))
    return {"data": data, "ckpt": run / "checkpoints" / "last.ckpt"}


def unwritable_place(tmp_path: Path) -> Path:
    """A folder nobody may write into: a 0555 folder, or (as root, whom modes do not stop) a
    read-only mount such as /sys; else a path under a file, which nobody can create either."""
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o555)
    for place in (folder, Path("/sys")):
        try:
            (place / "anchormass_probe").mkdir()
        except OSError:
            return place / "anchormass_out"
        (place / "anchormass_probe").rmdir()
    (tmp_path / "a_file").write_text("x")
    return tmp_path / "a_file" / "anchormass_out"


# entry point: its command with the path as `p`; what a working run leaves at `p`
ENTRY_POINTS = {
    "train.py": (lambda p, i: ["train.py", "model=standard_tiny", f"data_dir={i['data']}", *TINY,
                               f"hydra.run.dir={p}"], "train_result.json"),
    "sweep": (lambda p, i: ["train.py", "-m", "hydra/sweeper=optuna_optim", "hydra.sweeper.n_trials=1",
                            "model=standard_tiny", f"data_dir={i['data']}", *TINY, f"hydra.sweep.dir={p}"],
              "optimization_results.yaml"),
    "evaluate.py": (lambda p, i: ["evaluate.py", "suite=profile", "model=standard_tiny", f"out_dir={p}",
                                  "progress=false"], "results.json"),
    "scripts/prepare_data.py": (lambda p, i: ["scripts/prepare_data.py", "data=demo", f"data.out_dir={p}",
                                              "data.source.params.n_docs=30", "data.source.params.min_sentences=40",
                                              "data.source.params.max_sentences=80", "data.tokenizer.vocab_size=400"],
                                "meta.json"),
    "scripts/export_hf.py": (lambda p, i: ["scripts/export_hf.py", f"ckpt={i['ckpt']}", f"out={p}"], "config.json"),
    # a working curriculum trains every stage: only its refusals are run here (test_train_curriculum.py runs it)
    "scripts/run_curriculum.py": (lambda p, i: ["scripts/run_curriculum.py", f"runs_root={p}"], False),
}
KINDS = ["spaces, non-ASCII, new parents", "not writable"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_path_gives_a_working_run_or_one_error_line(inputs, tmp_path, entry, kind):
    command, made = ENTRY_POINTS[entry]
    if made is False and kind == KINDS[0]:
        pytest.skip("a working curriculum is a whole training run")
    path = tmp_path / "my runs" / "出力 é" / "new" / "out" if kind == KINDS[0] else unwritable_place(tmp_path)
    proc = subprocess.run([sys.executable, *command(path, inputs)], cwd=REPO, env=subprocess_env(),
                          capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr and "HYDRA_FULL_ERROR" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    if made and kind == KINDS[0]:   # a path that can be written: the run works
        assert proc.returncode == 0 and not errors, proc.stderr[-3000:]
        assert (path / made).is_file()
    else:   # it cannot be written (or read): one line, exit 2, naming the path
        assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-3000:]
        assert str(path) in errors[0] or str(path.parent) in errors[0], errors[0]
