"""The curriculum runner end to end, once (slow): every feature a recipe combines in one tiny run.

Two seeds x (Standard, a variant of AnchorMass) x (a shared 32-token stage 1, a 64-token stage 2),
then the closing comparison per seed and its aggregate over the seeds. The run is stopped by
SIGTERM in stage 1 (the runner passes it on; nothing starts from the unfinished stage), rerun to
the end (it resumes), rerun again (everything skipped), refused against a changed recipe unless
told to keep, and run where a stage fails. The real command runs where its console, its exit
code or its signals are what is tested; the reruns that train nothing call the library in-process.
Plans of the real recipes (configs/curriculum/*.yaml) are checked in tests/test_train_curriculum.py,
tests/test_curriculum_seeds.py, tests/test_curriculum_shared_stage.py and
tests/test_curriculum_studies.py, without training."""

import json
import os
import signal
import subprocess
import time

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from anchormass.curriculum.execute import LOCK_FILE_NAME
from anchormass.curriculum.runner import run_curriculum
from anchormass.errors import ConfigError
from anchormass.runs.preemption import EXIT_INTERRUPTED

from _train_helpers import CONFIG_DIR, REPO, subprocess_env
from test_train_curriculum import curriculum_cmd, tiny_curriculum

pytestmark = pytest.mark.slow

SEEDS = "curriculum.seeds=[0,1]"
# Stage 1 waits before its third step until the SIGTERM (sent once step 2's checkpoint exists) has
# arrived, so the stop lands at step 3 of 4 however loaded the machine: no sleep races the signal.
WAIT_FOR_STOP = ["+callbacks.wait._target_=_train_helpers.WaitForStop", "+callbacks.wait.step=2"]
VARIANT = {"name": "lossless", "model": "anchormass_tiny", "overrides": ["model.group_size=1"]}


def recipe(tmp_path) -> dict:
    """Stage 1 (4 steps, checkpoints every 2) shared by the Standard and the variant; stage 2 per model."""
    cur = tiny_curriculum(tmp_path, ["standard_tiny", VARIANT],
                          [("pretrain_1k", None, 32), ("warmup_4k", "pretrain_1k", 64)], parallel=2, evaluate=[
                              {"name": "cmp", "stage": "warmup_4k",
                               "overrides": ["suite=[ppl]", "eval=cpu_tiny", "eval.ppl.contexts=[0,16]",
                                             "eval.ppl.target_len=16", "eval.ppl.n_anchors=2",
                                             f"data_dir={tmp_path / 'data' / 'demo'}", "device=cpu"]}])
    cur["stages"][0]["shared"] = True
    cur["stages"][0]["set"]["total_steps"] = 4
    OmegaConf.save(cur, tmp_path / "configs" / "curriculum" / "t.yaml")
    return cur


def run_here(tmp_path, cur: dict, *extra: str, runs: str = "runs") -> None:
    """scripts/run_curriculum.py's work in this process: no process start where it would train nothing."""
    searchpath = f"hydra.searchpath=[file://{tmp_path / 'configs'}]"
    task = [f"curriculum={cur['name']}", f"runs_root={tmp_path / runs}", SEEDS, *extra]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("run_curriculum", overrides=[*task, searchpath])
    run_curriculum(cfg, task, [searchpath])


def _wait_for(path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"{path} never appeared (exit {proc.poll()})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_curriculum_end_to_end(tmp_path, capsys):
    cur = recipe(tmp_path)
    cmd = [*curriculum_cmd(tmp_path, cur), SEEDS]
    root = tmp_path / "runs" / "t"
    stage1 = root / "seed0" / "standard_tiny" / "pretrain_1k"

    # 1. SIGTERM to the runner mid-stage: the stage saves and exits first, no stage starts from it, exit 75.
    proc = subprocess.Popen(cmd + WAIT_FOR_STOP, cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for(stage1 / "checkpoints" / "step-0000002.ckpt", proc)
    child = json.loads((stage1 / ".run.lock").read_text())["pid"]  # the running stage's train.py
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_INTERRUPTED, out[-2000:] + err[-3000:]
    assert not _alive(child)  # no orphan
    assert "pretrain_1k  interrupted at step " in out
    assert err.strip().splitlines()[-1].startswith("interrupted: SIGTERM; ")
    result = json.loads((stage1 / "train_result.json").read_text())
    assert result["completed"] is False and result["global_step"] == 3
    assert not list(root.glob("seed*/*/warmup_4k")) and not (root / LOCK_FILE_NAME).exists()
    assert (tmp_path / "data" / "demo" / "meta.json").is_file()  # the runner prepared its data

    # 2. The same command again: the interrupted stage resumes, the rest trains, the comparison runs.
    proc = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (stage1 / "train.log").read_text()
    assert "ckpt_path=last" in log.split("===")[-1]  # resumed, not restarted
    assert "weights_only" not in log  # the SIGTERM save says what it saves; no unsafe-load look-alike line
    summary = json.loads((root / "curriculum.json").read_text())
    assert summary["seeds"] == [0, 1]
    assert sorted((s["seed"], s["model"], s["stage"], s["global_step"]) for s in summary["stages"]) == [
        (seed, model, stage, steps) for seed in (0, 1) for model in ("lossless", "standard_tiny")
        for stage, steps in (("pretrain_1k", 4), ("warmup_4k", 2))]
    for seed in (0, 1):
        seed_dir = root / f"seed{seed}"
        # the shared stage: trained once per seed, by the first model; the variant starts from it
        assert not (seed_dir / "lossless" / "pretrain_1k").exists()
        shared_ckpt = seed_dir / "standard_tiny" / "pretrain_1k" / "checkpoints" / "last.ckpt"
        args = (seed_dir / "lossless" / "warmup_4k" / "train.log").read_text().splitlines()[0]
        assert f"init_from={shared_ckpt}" in args and "init_across_arch=true" in args
        assert f"seed={seed}" in args and "model.group_size=1" in args  # the chain's seed, the variant's override
        hp = torch.load(seed_dir / "lossless" / "warmup_4k" / "checkpoints" / "last.ckpt",
                        weights_only=False)["hyper_parameters"]
        assert hp["model_config"]["arch"] == "anchormass" and hp["model_config"]["group_size"] == 1
        assert hp["trained_lengths"] == [32, 64]  # stage 1 then stage 2: chained
        assert torch.load(shared_ckpt, weights_only=False)["hyper_parameters"]["model_config"]["arch"] == "standard"
        assert (root / "report" / "cmp" / f"seed{seed}" / "report.md").is_file()
    assert "shared: trained once, by standard_tiny" in proc.stdout
    # The console: a line per finished stage, the table with its seed column, every report path;
    # the libraries' chatter and the train.py command lines are only in the stages' logs.
    console = proc.stdout + proc.stderr
    assert sorted(line.split()[:3] for line in console.splitlines() if " done " in line) == sorted(
        [f"seed{seed}", model, stage] for seed in (0, 1) for model, stage in [
            ("standard_tiny", "pretrain_1k"), ("standard_tiny", "warmup_4k"), ("lossless", "warmup_4k")]), console
    assert any(line.split()[:1] == ["seed"] for line in proc.stdout.splitlines())
    for noise in ("GPU available", "Tip", "Trainable params", "hydra.run.dir=", "Epoch 0"):
        assert noise not in console
    log = (root / "seed1" / "lossless" / "warmup_4k" / "train.log").read_text()
    for kept in ("GPU available", "Trainable params", "hydra.run.dir=", "done: step 2"):
        assert kept in log
    last = json.loads((root / "seed1" / "lossless" / "warmup_4k" / "progress.jsonl").read_text().splitlines()[-1])
    assert last["step"] == last["total"] == 2 and last["loss"] > 0 and last["tokens_per_s"] > 0
    # The comparison per seed, then aggregated over the seeds, then joined under its stage's heading.
    agg = json.loads((root / "report" / "cmp" / "results.json").read_text())
    assert agg["seeds"] == [0, 1] and all(s["n"] == 2 for s in agg["suites"]["ppl"]["json"]["summary"].values())
    report = (root / "report" / "cmp" / "report.md").read_text()
    assert "seed0/report.md" in report and "## ppl" in report
    assert "- standard_tiny (ckpt, A) vs lossless (compare_ckpt, B) at stage warmup_4k" in report
    assert f"report: {root / 'report' / 'cmp' / 'report.md'}" in proc.stdout
    closing = (root / "report" / "report.md").read_text()
    assert "## cmp: standard_tiny vs lossless, checkpoints of stage warmup_4k" in closing and "### ppl" in closing

    # 3. Again (in-process from here on: no stage trains): every finished stage is skipped.
    capsys.readouterr()
    run_here(tmp_path, cur, "evaluate=false")
    assert capsys.readouterr().out.count("skipped (already done)") == 6
    # A changed recipe: the finished stages are not credited to it (one line, nothing touched) ...
    with pytest.raises(ConfigError, match=r"pretrain_1k does not match what the recipe gives now"
                                          r".*stage.lr: [0-9.e-]+ -> 0.05") as changed:
        run_here(tmp_path, cur, "evaluate=false", "stage.lr=0.05")
    assert "\n" not in str(changed.value) and " done " not in capsys.readouterr().out
    # ... unless the command says to keep them
    run_here(tmp_path, cur, "evaluate=false", "stage.lr=0.05", "changed=keep")
    assert capsys.readouterr().out.count("skipped (already done)") == 6

    # 4. A stage that fails: its log's path and last lines on the console, the stage's exit code,
    # and its chain stops there.
    with pytest.raises(SystemExit) as fail:
        run_here(tmp_path, cur, "evaluate=false", "stage.total_steps=many", runs="failing")
    shown = capsys.readouterr().out
    failed = tmp_path / "failing" / "t" / "seed0" / "standard_tiny" / "pretrain_1k" / "train.log"
    assert fail.value.code == 2, shown
    assert "pretrain_1k  FAILED: error: stage.total_steps must be a whole number, got 'many' (exit 2" in shown
    assert f"log: {failed}" in shown and "| error: stage.total_steps must be a whole number, got 'many'" in shown
    assert "fix what it names" in shown and "rerun the same command to resume" not in shown
    assert "warmup_4k" not in shown  # the chain stops at its first failure
