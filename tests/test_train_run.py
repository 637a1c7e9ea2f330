"""In-process training runs: every config composes, every stage trains for both tiny models,
stage chaining, NaN stop, bad input."""

import json
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from anchormass.data.datamodule import datamodule_config
from anchormass.errors import CheckpointError, ConfigError, DataError
from anchormass.models import load_model_config
from anchormass.runs.start_module import check_same_architecture
from anchormass.runs.train import train
from anchormass.training.callbacks import TrainingDiverged
from anchormass.training.checkpoint import load_model, read_checkpoint
from anchormass.training.checkpoint_tokenizer import from_carried

from _train_helpers import FAST, compose_train, stage_data

STAGES = ["pretrain_1k", "warmup_4k", "longctx_8k", "longctx_16k", "longctx_32k", "chat_sft"]
MODELS = ["standard_tiny", "anchormass_tiny"]


def test_every_config_composes(tmp_path):
    """Each option of each of our groups composes with the defaults and fully resolves."""
    from hydra import compose, initialize_config_dir

    from _train_helpers import CONFIG_DIR

    groups = {"stage": STAGES, "trainer": ["cpu", "gpu", "ddp", "ddp_cpu", "fsdp"],
              "logger": ["csv", "tensorboard", "wandb", "none"], "callbacks": ["default"],
              "experiment": ["standard_158m", "anchormass_158m", "demo_tiny"]}
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        for group, options in groups.items():
            for option in options:
                cfg = compose("train", overrides=[f"{group}={option}", f"output_dir={tmp_path}"])
                OmegaConf.resolve(cfg)  # every interpolation resolves
                assert cfg.stage.total_steps >= 1 and cfg.optim.lr == cfg.stage.lr


def test_full_scale_defaults_match_the_write_up(tmp_path):
    s1 = compose_train(["stage=pretrain_1k", "model=standard_158m"], tmp_path)
    assert (s1.stage.seq_len, s1.stage.global_batch_size, s1.stage.total_steps, s1.seed) == (1024, 64, 45776, 42)
    s2 = compose_train(["stage=warmup_4k", "model=anchormass_158m"], tmp_path)
    assert (s2.stage.seq_len, s2.stage.global_batch_size, s2.stage.total_steps, s2.seed) == (4096, 2, 2000, 42)


def test_every_group_instantiates(data, tmp_path):
    """Callbacks, loggers, strategies and the datamodule of every stage build as objects."""
    for trainer in ["cpu", "gpu", "ddp", "fsdp"]:
        for logger in ["csv", "tensorboard", "wandb"]:
            cfg = compose_train([f"trainer={trainer}", f"logger={logger}"], tmp_path)
            assert instantiate(cfg.logger) is not None
        if isinstance(cfg.trainer.strategy, str):
            assert cfg.trainer.strategy == "auto"
        else:
            assert type(instantiate(cfg.trainer.strategy)).__name__ in ("DDPStrategy", "SafeFSDPStrategy")
    assert all(instantiate(c) is not None for c in cfg.callbacks.values())
    for stage in STAGES:
        scfg = compose_train([f"stage={stage}", f"data_dir={stage_data(stage, data)}", *FAST], tmp_path)
        kind = json.loads((Path(scfg.data_dir) / "meta.json").read_text())["kind"]
        dm = instantiate(datamodule_config(scfg.stage.datamodule, kind))  # the data's kind picks the class
        assert dm.seq_len == 64 and dm.global_batch_size == 2


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_trains_both_models(stage, data, tmp_path):
    for model in MODELS:
        out = tmp_path / model
        # Long-context examples are 257 tokens with the answers at the end: train on all of them.
        seq = ["stage.seq_len=256"] if stage.startswith("longctx") else []
        cfg = compose_train([f"stage={stage}", f"model={model}", f"data_dir={stage_data(stage, data)}", *FAST,
                             "trainer.peak_tflops=0.001", *seq], out)
        result = train(cfg)
        assert result["global_step"] == 2
        assert result["metrics"]["perf/tokens_per_s"] > 0 and 0 < result["metrics"]["perf/mfu"]
        assert result["metrics"]["train/target_tokens"] > 0  # the loss really covered some targets
        res = json.loads((out / "train_result.json").read_text())
        assert res["stage"] == stage and torch.isfinite(torch.tensor(res["metrics"]["train/loss"]))
        loaded, hp = load_model(out / "checkpoints" / "last.ckpt")
        assert hp["model_config"]["arch"] == model.split("_")[0]
        assert hp["model_config"]["vocab_size"] == 400  # from the prepared data, not the preset's 28,000
        length = 256 if stage.startswith("longctx") else 64
        assert hp["trained_lengths"] == [length] and hp["model_config"]["original_max_len"] == length
        assert hp["tokenizer_path"].endswith("tokenizer.model") and hp["data_fingerprint"]
        # the checkpoint carries the tokenizer itself, and its path is absolute (checkpoint_tokenizer.py)
        assert Path(hp["tokenizer_path"]).is_absolute() and from_carried(hp["tokenizer_files"]).model_bytes == \
            Path(hp["tokenizer_path"]).read_bytes()
        assert hp["tokenizer_checksum"] == json.loads((stage_data(stage, data) / "meta.json").read_text())[
            "tokenizer_checksum"]
        logits = loaded(torch.zeros(1, 8, dtype=torch.long))
        assert logits.shape == (1, 8, 400) and torch.isfinite(logits).all()


def test_stage_chaining_starts_from_previous_weights(data, tmp_path):
    """Stage 2 -> 3a: the 3a run's weights at step 0 are exactly stage 2's final weights, and the
    trained lengths (RoPE original_max_len) accumulate."""
    def run(stage, seq_len, out, init_from=None):
        over = [f"stage={stage}", "model=anchormass_tiny", f"data_dir={stage_data(stage, data)}", *FAST,
                f"stage.seq_len={seq_len}", "+callbacks.spy._target_=_train_helpers.WeightsAtStart",
                f"+callbacks.spy.path={out}/start.pt"]
        result = train(compose_train(over + ([f"init_from={init_from}"] if init_from else []), out))
        return torch.load(out / "start.pt"), result["last_checkpoint"]

    _, ckpt1 = run("pretrain_1k", 32, tmp_path / "s1")
    _, ckpt2 = run("warmup_4k", 64, tmp_path / "s2", ckpt1)
    start3a, ckpt3 = run("longctx_8k", 256, tmp_path / "s3a", ckpt2)
    saved2 = {k[len("model."):]: v for k, v in read_checkpoint(ckpt2)["state_dict"].items()}
    assert start3a.keys() == saved2.keys()
    assert all(torch.equal(start3a[k], saved2[k]) for k in saved2)
    hp3 = read_checkpoint(ckpt3)["hyper_parameters"]
    assert hp3["trained_lengths"] == [32, 64, 256] and hp3["model_config"]["original_max_len"] == 256
    assert read_checkpoint(ckpt3)["global_step"] == 2  # a fresh schedule, not stage 2's step count


def test_init_from_other_architecture_is_refused(data, tmp_path):
    cfg = compose_train(["model=standard_tiny", f"data_dir={data['pretrain']}", *FAST], tmp_path / "a")
    ckpt = train(cfg)["last_checkpoint"]
    cfg = compose_train(["model=anchormass_tiny", f"data_dir={data['pretrain']}", f"init_from={ckpt}", *FAST],
                        tmp_path / "b")
    with pytest.raises(CheckpointError, match="different model.*arch.*init_across_arch=true"):
        train(cfg)
    # Resuming ("last" = this run folder's last.ckpt) as the other architecture is refused too,
    # with or without init_across_arch (a resume continues one run).
    for flag in ([], ["init_across_arch=true"]):
        cfg = compose_train(["model=anchormass_tiny", f"data_dir={data['pretrain']}", "ckpt_path=last", *FAST, *flag],
                            tmp_path / "a")
        with pytest.raises(CheckpointError, match="different model.*arch"):
            train(cfg)


def test_init_across_arch_starts_anchormass_from_standard_weights(data, tmp_path):
    cfg = compose_train(["model=standard_tiny", f"data_dir={data['pretrain']}", *FAST], tmp_path / "a")
    ckpt = train(cfg)["last_checkpoint"]
    cfg = compose_train(["model=anchormass_tiny", f"data_dir={data['pretrain']}", f"init_from={ckpt}",
                         "init_across_arch=true", *FAST], tmp_path / "b")
    hp = read_checkpoint(train(cfg)["last_checkpoint"])["hyper_parameters"]
    assert hp["model_config"]["arch"] == "anchormass"
    # only the architecture may differ: other shapes are still refused
    saved = dict(read_checkpoint(ckpt)["hyper_parameters"]["model_config"], d_model=64)
    with pytest.raises(CheckpointError, match="d_model: 64 in checkpoint vs 128"):
        check_same_architecture(saved, load_model_config("anchormass_tiny"), "x.ckpt", across_arch=True)


def test_resume_checks_the_new_fields_and_accepts_checkpoints_older_than_them():
    cfg = load_model_config("anchormass_tiny")
    old = {k: v for k, v in cfg.to_dict().items() if k not in ("n_kv_heads", "tie_embeddings")}
    check_same_architecture(old, cfg, "old.ckpt")  # no error: the same model
    with pytest.raises(CheckpointError, match="n_kv_heads: None in checkpoint vs 2.*tie_embeddings"):
        check_same_architecture(old, cfg.replace(n_kv_heads=2, tie_embeddings=True), "old.ckpt")


def test_init_from_with_another_tokenizer_is_refused(tmp_path):
    from anchormass.runs.start_module import check_same_tokenizer

    saved = {"tokenizer_checksum": "a" * 64}
    with pytest.raises(CheckpointError, match="tokenizer aaaaaaaaaaaa, but .* tokenized with 000000000000"):
        check_same_tokenizer(saved, {"tokenizer_checksum": "0" * 64}, "x.ckpt", tmp_path)
    check_same_tokenizer(saved, {"tokenizer_checksum": "a" * 64}, "x.ckpt", tmp_path)  # same tokenizer: fine


def test_nan_stops_the_run_and_keeps_last_good_checkpoint(data, tmp_path):
    over = ["model=standard_tiny", f"data_dir={data['pretrain']}", *FAST, "stage.total_steps=6",
            "stage.ckpt_every=2", "+callbacks.poison._target_=_train_helpers.PoisonAt", "+callbacks.poison.step=3"]
    cfg = compose_train(over, tmp_path)
    with pytest.raises(TrainingDiverged) as err:
        train(cfg)
    msg = str(err.value)
    assert "nan" in msg and "step 3" in msg and "last.ckpt" in msg and "\n" not in msg
    ckpt = read_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 2  # step 3's poisoned weights were never saved
    assert all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())
    assert not (tmp_path / "train_result.json").exists()


def test_bad_input_fails_fast_with_one_line(data, tmp_path):
    with pytest.raises(DataError, match="no prepared data folder"):
        train(compose_train([f"data_dir={tmp_path / 'nope'}", *FAST], tmp_path / "o1"))
    with pytest.raises(CheckpointError, match="not found"):
        train(compose_train([f"data_dir={data['pretrain']}", f"ckpt_path={tmp_path / 'x.ckpt'}", *FAST], tmp_path))
    with pytest.raises(CheckpointError, match="not found"):
        train(compose_train([f"data_dir={data['pretrain']}", f"init_from={tmp_path / 'x.ckpt'}", *FAST], tmp_path))
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="not writable"):
        train(compose_train([f"data_dir={data['pretrain']}", *FAST], blocker / "sub"))
    # the data's kind picks the DataModule (a DataModule of one's own still checks its kind)
    with pytest.raises(DataError, match="needs 'sft'"):
        train(compose_train(["stage=chat_sft", f"data_dir={data['pretrain']}", *FAST,
                             "+stage.datamodule._target_=anchormass.data.datamodule.SFTDataModule"], tmp_path / "o2"))
    with pytest.raises(DataError, match="no DataModule reads 'shards' data"):
        datamodule_config(OmegaConf.create({"seq_len": 8}), "shards")
    for bad in ("seed=abc", "stage.total_steps=many"):
        with pytest.raises(ConfigError, match=f"{bad.split('=')[0]} must be a whole number"):
            train(compose_train([f"data_dir={data['pretrain']}", *FAST, bad], tmp_path / "o3"))
    assert not (tmp_path / "o3").exists()


def test_eval_callbacks_run_the_evaluation_suites_during_training(data, tmp_path):
    """callbacks=with_eval: the eval library's suites on the live model (here ppl at smoke sizes)."""
    over = ["model=anchormass_tiny", f"data_dir={data['pretrain']}", *FAST, "callbacks=with_eval",
            "callbacks.eval.suites=[ppl]", "callbacks.eval.every_n_steps=2", "logger=csv"]
    train(compose_train(over, tmp_path))
    assert (tmp_path / "eval" / "step0000002" / "results.json").is_file()
    header = (tmp_path / "logs" / "metrics.csv").read_text().splitlines()[0]
    assert "eval/ppl/" in header, header  # the suite's scalars reached the trainer's logger
