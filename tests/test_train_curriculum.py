"""The curriculum runner: plan, chaining, resume/skip logic, and one tiny end-to-end run (slow)."""

import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from _train_helpers import REPO, subprocess_env
from anchormass.errors import ConfigError
from anchormass.training.curriculum import command, datasets, load_curriculum, merge_overrides, plan


def test_mini_plan_chains_stages_for_both_models(tmp_path):
    cfg = load_curriculum("mini")
    runs = plan(cfg, tmp_path, ["trainer=cpu"])
    assert [(r.model, r.stage) for r in runs[:6]] == [("standard_tiny", s) for s in
                                                      ["pretrain_1k", "warmup_4k", "longctx_8k", "longctx_16k",
                                                       "longctx_32k", "chat_sft"]]
    by = {(r.model, r.stage): r for r in runs}
    for model in ("standard_tiny", "anchormass_tiny"):
        assert by[(model, "pretrain_1k")].init_from is None
        assert by[(model, "longctx_8k")].init_from == by[(model, "warmup_4k")].last_ckpt  # 2 -> 3a
        assert by[(model, "chat_sft")].init_from == by[(model, "warmup_4k")].last_ckpt  # 2 -> 3b
        assert by[(model, "longctx_32k")].out_dir == tmp_path / "mini" / model / "longctx_32k"
    # Both models get identical data arguments (seed-synchronised batches).
    strip = lambda r: [a for a in r.args if not a.startswith(("model=", "hydra.run.dir="))]  # noqa: E731
    assert strip(by[("standard_tiny", "warmup_4k")]) == strip(by[("anchormass_tiny", "warmup_4k")])


def test_full_curriculum_plans_and_datasets():
    cfg = load_curriculum("full_158m")
    runs = plan(cfg, REPO / "runs", ["trainer=ddp", "trainer.devices=8"])
    assert {r.model for r in runs} == {"standard_158m", "anchormass_158m"} and len(runs) == 12
    assert all("trainer=ddp" in r.args and "trainer=gpu" not in r.args for r in runs)
    folders = [f.name for _, f in datasets(cfg)]
    assert folders == ["aozora", "longctx_8k", "longctx_16k", "longctx_32k", "alpaca"]


def test_merge_overrides_later_wins():
    assert merge_overrides(["trainer=gpu", "a.b=1", "trainer=ddp", "a.b=2"]) == ["trainer=ddp", "a.b=2"]


def test_command_resumes_own_checkpoint_else_starts_from_parent(tmp_path):
    runs = plan(load_curriculum("mini"), tmp_path, [])
    warm = runs[1]
    assert f"init_from={runs[0].last_ckpt}" in command(warm)
    warm.last_ckpt.parent.mkdir(parents=True)
    warm.last_ckpt.write_bytes(b"x")
    cmd = command(warm)
    assert f"ckpt_path={warm.last_ckpt}" in cmd and not any(a.startswith("init_from=") for a in cmd)
    assert not warm.is_done()
    (warm.out_dir / "train_result.json").write_text(json.dumps({"global_step": 60, "total_steps": 60}))
    assert warm.is_done()


def test_bad_curricula_are_rejected(tmp_path):
    with pytest.raises(ConfigError, match="unknown curriculum"):
        load_curriculum("nope")
    bad = tmp_path / "bad.yaml"
    OmegaConf.save({"name": "x", "models": ["standard_tiny"],
                    "stages": [{"stage": "warmup_4k", "data": "demo", "init_from": "pretrain_1k"}]}, bad)
    with pytest.raises(ConfigError, match="not an earlier stage"):
        plan(load_curriculum(str(bad)), tmp_path, [])


@pytest.mark.slow
def test_tiny_curriculum_end_to_end(tmp_path):
    """run_curriculum.py: prepares its data, trains 2 chained stages, a rerun skips them (one model here:
    both models' plans are checked above, and each run costs a process start)."""
    data = str(tmp_path / "data" / "demo")
    shrink = [f"data.out_dir={data}", "data.source.params.n_docs=30", "data.source.params.min_sentences=40",
              "data.source.params.max_sentences=80", "data.tokenizer.vocab_size=400"]
    fast = {"global_batch_size": 2, "micro_batch_size": 2, "warmup_steps": 1, "val_every": 2, "val_batches": 1,
            "ckpt_every": 2}
    cur = {"name": "t", "models": ["anchormass_tiny"], "trainer": "cpu",
           "overrides": ["logger=none", "trainer.enable_progress_bar=false", "stage.datamodule.num_workers=0",
                         "torch_threads=1"],
           "stages": [{"stage": "pretrain_1k", "init_from": None, "data": "demo", "data_overrides": shrink,
                       "set": {**fast, "seq_len": 32, "total_steps": 2}},
                      {"stage": "warmup_4k", "init_from": "pretrain_1k", "data": "demo", "data_overrides": shrink,
                       "set": {**fast, "seq_len": 64, "total_steps": 2}}]}
    path = tmp_path / "t.yaml"
    OmegaConf.save(cur, path)
    cmd = [sys.executable, str(REPO / "scripts" / "run_curriculum.py"), f"curriculum={path}",
           f"runs_root={tmp_path / 'runs'}", "evaluate=false"]
    proc = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "t" / "curriculum.json").read_text())
    assert [(s["model"], s["stage"], s["global_step"]) for s in summary["stages"]] == [
        ("anchormass_tiny", "pretrain_1k", 2), ("anchormass_tiny", "warmup_4k", 2)]
    hp = __import__("torch").load(tmp_path / "runs" / "t" / "anchormass_tiny" / "warmup_4k" / "checkpoints" /
                                  "last.ckpt", weights_only=False)["hyper_parameters"]
    assert hp["trained_lengths"] == [32, 64]
    again = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and again.stdout.count("already done, skipped") == 2
