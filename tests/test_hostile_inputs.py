"""Hostile inputs: what was tried, and what must happen. One row per finding (issue 46 items 5-9
first); a new finding is a new row.

Every row runs in-process on tiny inputs. `run(tmp_path, monkeypatch, capsys)` does what was tried
and returns the text that answers it: the one `error:` line of a refusal (an AnchorMassError, or
exit 2 with its line on stderr), or the output that must come of an input that is fine. The row's
`must` is a pattern that text must contain; a refusal must be one line, never a traceback.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

from anchormass.errors import AnchorMassError
from anchormass.utils import CHECKOUT, CONFIG_ROOT


@dataclass(frozen=True)
class Case:
    id: str
    tried: str
    run: Callable
    must: str


def refusal(fn, capsys) -> str:
    """The one-line refusal `fn()` ends in (AnchorMassError, or exit 2 with `error:` on stderr)."""
    try:
        fn()
    except AnchorMassError as err:
        return f"error: {err}"
    except SystemExit as stop:
        assert stop.code == 2, f"exit {stop.code}, not 2"
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, errors
        return errors[0]
    pytest.fail("accepted")


# -- 5: a finished stage is its composed config and its data, not its arguments ---------------------------------

STAGE = ["stage=pretrain_1k", "model=standard_tiny", "stage.total_steps=4", "hydra.run.dir=/x"]


def curriculum_stage(tmp_path, monkeypatch, extra=()):
    """A finished stage recorded as execute.py records it, under a copy of configs/ the row may edit."""
    from anchormass.curriculum import stage_identity
    from anchormass.curriculum.execute import StageRun, stage_record
    from anchormass.runs.layout import STAGE_ARGS_FILE as ARGS_FILE

    configs = tmp_path / "configs"
    shutil.copytree(CONFIG_ROOT, configs)
    monkeypatch.setattr(stage_identity, "CONFIG_ROOT", configs)
    folder = tmp_path / "runs" / "m" / "a"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "last.ckpt").write_bytes(b"x")
    (folder / "train_result.json").write_text(json.dumps({"completed": True, "global_step": 4, "total_steps": 4}))
    then = StageRun("m", "a", folder, None, [*STAGE, *extra])
    stage_identity.identify([then])
    (folder / ARGS_FILE).write_text(json.dumps(stage_record(then)))
    return configs, folder, lambda: StageRun("m", "a", folder, None, [*STAGE, *extra])


def changed_preset(tmp_path, monkeypatch, capsys):
    from anchormass.curriculum.changes import check_changes

    configs, _, now = curriculum_stage(tmp_path, monkeypatch)
    preset = configs / "model" / "anchormass_tiny.yaml"  # standard_tiny's defaults list names it
    preset.write_text(re.sub(r"(?m)^n_layers: \d+", "n_layers: 3", preset.read_text()))
    return refusal(lambda: check_changes([now()], "refuse"), capsys)


def changed_default(tmp_path, monkeypatch, capsys):
    from anchormass.curriculum.changes import check_changes

    configs, _, now = curriculum_stage(tmp_path, monkeypatch)
    train = configs / "train.yaml"
    train.write_text(train.read_text().replace("weight_decay: 0.1", "weight_decay: 0.05"))
    return refusal(lambda: check_changes([now()], "refuse"), capsys)


def lost_record(damage):
    def run(tmp_path, monkeypatch, capsys):
        from anchormass.curriculum.changes import check_changes
        from anchormass.curriculum.execute import StageRun
        from anchormass.runs.layout import STAGE_ARGS_FILE as ARGS_FILE

        _, folder, _ = curriculum_stage(tmp_path, monkeypatch)
        damage(folder / ARGS_FILE)
        changed = StageRun("m", "a", folder, None, [*STAGE, "stage.lr=0.01"])  # and the recipe changed
        return refusal(lambda: check_changes([changed], "refuse"), capsys)
    return run


def reprepared_data(tmp_path, monkeypatch, capsys):
    from anchormass.curriculum.changes import check_changes
    from anchormass.data.testing import tiny_pretrain

    data = tiny_pretrain(tmp_path / "data" / "tiny", seed=3)
    _, _, now = curriculum_stage(tmp_path, monkeypatch, [f"data_dir={data}"])
    check_changes([now()], "refuse")  # the config is unchanged
    tiny_pretrain(data, seed=4)  # the same folder, prepared again with another corpus seed
    return refusal(lambda: check_changes([now()], "refuse", data=True), capsys)


# -- 6: a sweep's fixed settings are part of its study ------------------------------------------------------------

def run_sweep(tmp_path, steps):
    """optuna_search.sweep in `tmp_path` with stage.total_steps=`steps` and a stand-in of the Optuna
    plugin that runs one trial."""
    import optuna
    from omegaconf import OmegaConf

    from anchormass.runs.optuna_search import sweep

    class Impl:  # what optuna_search.sweep reads of the Optuna plugin's OptunaSweeperImpl
        def __init__(self, steps):
            self.storage, self.study_name, self.job_idx, self.n_trials = None, "s", 0, 1
            self.sampler = optuna.samplers.RandomSampler(seed=0)
            self.params = {"optim.lr": "tag(log, interval(1e-4, 1e-2))"}
            self.config = OmegaConf.create({"stage": {"total_steps": steps}, "optim": {"lr": 0.1}})
            self._configure_trials = lambda trials, *args: None

        def _get_directions(self):
            return ["minimize"]

    impl = Impl(steps)

    def one_trial():  # the plugin's sweep: one trial, told a value
        study = optuna.load_study(study_name="s", storage=impl.storage)
        study.tell(study.ask(), float(steps))

    sweep(impl, tmp_path, [f"stage.total_steps={steps}"], one_trial, 0)


def continued_sweep(tmp_path, monkeypatch, capsys):
    run_sweep(tmp_path, 4)
    return refusal(lambda: run_sweep(tmp_path, 3), capsys)


def unrecorded_sweep(tmp_path, monkeypatch, capsys):
    import optuna

    from anchormass.runs.optuna_journal import JournalStorage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="s", storage=JournalStorage(tmp_path / "optuna_study.jsonl"))
    study.tell(study.ask(), 1.0)  # a trial, as a sweep before the settings were recorded left it
    return refusal(lambda: run_sweep(tmp_path, 4), capsys)


def legacy_sweep_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "0" / ".hydra").mkdir(parents=True)  # a trial of a sweep from before the journal
    (tmp_path / "0" / ".hydra" / "config.yaml").write_text("stage:\n  total_steps: 4\noptim:\n  lr: 0.003\n")
    return refusal(lambda: run_sweep(tmp_path, 3), capsys)


def overrides_not_strings(tmp_path, monkeypatch, capsys):
    import optuna

    from anchormass.runs.optuna_search import params_of

    (tmp_path / "0" / ".hydra").mkdir(parents=True)
    (tmp_path / "0" / ".hydra" / "overrides.yaml").write_text("- 1\n- {optim.lr: 2}\n")
    return f"params {params_of(tmp_path / '0', {'optim.lr': optuna.distributions.LogUniformDistribution(1e-4, 1)})}"


# -- 7: formats by content after decompression --------------------------------------------------------------------

def gzipped_jsonl(tmp_path, monkeypatch, capsys):
    from anchormass.data.corpus_files import files_format

    path = tmp_path / "corpus.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"text": f"文書 {i}"}, ensure_ascii=False) + "\n" for i in range(3))
    return f"read as {files_format([str(path)], None)}"


def gzip_named_plain(tmp_path, monkeypatch, capsys):
    from anchormass.data.corpus_files import files_format

    path = tmp_path / "corpus.jsonl"
    path.write_bytes(gzip.compress(b'{"text": "a"}\n'))
    return refusal(lambda: files_format([str(path)], None), capsys)


def zstd_bytes(tmp_path, monkeypatch, capsys):
    from anchormass.data.corpus_files import files_format

    path = tmp_path / "corpus.jsonl"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + bytes(range(40)))  # a zstd frame's magic, then its bytes
    return refusal(lambda: files_format([str(path)], None), capsys)


# -- 8: one line where a traceback was ----------------------------------------------------------------------------

def shard_summary(tmp_path, monkeypatch, capsys):
    from omegaconf import OmegaConf

    from anchormass.commands.prepare_data import run

    run(OmegaConf.create({"data": {
        "name": "tiny", "kind": "pretrain", "out_dir": str(tmp_path / "tiny"), "val_fraction": 0.2,
        "num_shards": 2, "shard_index": 0, "block_docs": 2, "tokenizer": {"vocab_size": 400, "model_type": "bpe"},
        "source": {"kind": "demo", "params": {"n_docs": 6, "seed": 3, "min_sentences": 30, "max_sentences": 60}}}}))
    return capsys.readouterr().out


def unset_env(tmp_path, monkeypatch, capsys):
    from anchormass.cli import check_overrides
    from anchormass.runs.launch_checks import check_train_launch

    monkeypatch.delenv("ANCHORMASS_UNSET_46", raising=False)
    return refusal(lambda: check_overrides(CONFIG_ROOT, "train", ["data_dir=${oc.env:ANCHORMASS_UNSET_46}/demo"],
                                           check=check_train_launch), capsys)


def linked_out_dir(tmp_path, monkeypatch, capsys):
    from anchormass.eval.runner import run_evaluation

    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "results.json").write_text("{}")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    return refusal(lambda: run_evaluation({"suite": "ppl", "out_dir": str(tmp_path / "link"), "overwrite": True,
                                           "ckpt": str(tmp_path / "none.ckpt")}), capsys)


def journal_with(line: str):
    def run(tmp_path, monkeypatch, capsys):
        import optuna

        from anchormass.runs.optuna_journal import JournalStorage

        path = tmp_path / "optuna_study.jsonl"
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        optuna.create_study(study_name="s", storage=JournalStorage(path))
        with open(path, "a") as f:
            f.write(line + "\n")
        return refusal(lambda: JournalStorage(path), capsys)
    return run


def tiny_checkpoint(path: Path, **claims) -> Path:
    """A training-format checkpoint of random standard_tiny weights (vocab 400) whose model_config
    claims `claims`; nan weights with nan=True."""
    from anchormass.models import build_model, load_model_config
    from anchormass.training.checkpoint import atomic_torch_save

    nan = claims.pop("nan", False)
    cfg = load_model_config("standard_tiny").replace(vocab_size=400)
    torch.manual_seed(0)
    state = build_model(cfg).state_dict()
    if nan:
        state["embed.weight"][0, 0] = float("nan")
    atomic_torch_save({"state_dict": {f"model.{k}": v for k, v in state.items()},
                       "hyper_parameters": {"model_config": {**cfg.to_dict(), **claims}, "trained_lengths": [64]}},
                      path)
    return path


def evaluate_models(**cfg):
    from anchormass.eval.loading import load_models

    return lambda: load_models(cfg, torch.device("cpu"), torch.float32)


def huge_vocab_evaluate(tmp_path, monkeypatch, capsys):
    ckpt = tiny_checkpoint(tmp_path / "huge.ckpt", vocab_size=2 ** 40)
    return refusal(evaluate_models(ckpt=str(ckpt)), capsys)


def huge_vocab_export(tmp_path, monkeypatch, capsys):
    from anchormass.hf.export import load_source

    ckpt = tiny_checkpoint(tmp_path / "huge.ckpt", vocab_size=2 ** 40)
    return refusal(lambda: load_source(ckpt), capsys)


def nan_compared(tmp_path, monkeypatch, capsys):
    good, bad = tiny_checkpoint(tmp_path / "good.ckpt"), tiny_checkpoint(tmp_path / "bad.ckpt", nan=True)
    return refusal(evaluate_models(ckpt=str(good), compare_ckpt=str(bad)), capsys)


def nan_alone(tmp_path, monkeypatch, capsys):
    evaluate_models(ckpt=str(tiny_checkpoint(tmp_path / "bad.ckpt", nan=True)))()
    return capsys.readouterr().err


def nan_scores(models: int):
    def run(tmp_path, monkeypatch, capsys):
        from anchormass.commands.evaluate import check_scores_finite

        path = tmp_path / "results.json"
        path.write_text(json.dumps({"models": [{}] * models, "suites": {
            "ppl": {"summary": {"a/ctx64/ppl": float("nan"), "b/ctx64/ppl": 3.5}}}}))
        try:
            check_scores_finite(path)
        except SystemExit as stop:
            return f"exit {stop.code}: {capsys.readouterr().err.strip()}"
        return f"exit 0: {capsys.readouterr().err.strip()}"
    return run


def nan_paired_statistics(tmp_path, monkeypatch, capsys):
    from anchormass.eval.report import paired_nll_by_length

    row = paired_nll_by_length({64: [1.0, 2.0, 3.0]}, {64: [float("nan")] * 3})[64]
    return f"p {row['p_wilcoxon']} ({row['wilcoxon_method']}), holm {row['p_holm']}"


# -- 9 ------------------------------------------------------------------------------------------------------------

def aggregate_inputs(link: bool):
    def run(tmp_path, monkeypatch, capsys):
        from anchormass.eval.aggregate import main

        a = tmp_path / "a.json"
        a.write_text(json.dumps({"suites": {"ppl": {"summary": {"x/ppl": 3.0}}}}))
        b = tmp_path / "b.json"
        b.symlink_to(a)
        second = b if link else a
        return refusal(lambda: main([f"out_dir={tmp_path / 'agg'}", f"inputs=[{a},{second}]", "seeds=[0,1]"]), capsys)
    return run


def comma_runs_root(tmp_path, monkeypatch, capsys):
    from hydra import compose, initialize_config_dir

    from anchormass.curriculum import runner

    def no_data(*args):  # before the fix every stage was then refused: this row stops here instead
        raise AssertionError("runs_root with a comma was accepted")

    monkeypatch.setattr(runner, "prepare_data", no_data)
    root = tmp_path / "runs,old"
    with initialize_config_dir(config_dir=str(CONFIG_ROOT), version_base="1.3"):
        cfg = compose("run_curriculum", overrides=[f'runs_root="{root}"', "evaluate=false"])
    return refusal(lambda: runner.run_curriculum(cfg, [], []), capsys)


CASES = [
    Case("46.5 preset", "a stage finished, then a preset file its preset inherits (configs/model/*.yaml) changed",
         changed_preset, r"^error: .*m/a does not match what the recipe gives now \(model.n_layers: 2 -> 3\)"),
    Case("46.5 default", "a stage finished, then a default of configs/train.yaml changed",
         changed_default, r"\(optim.weight_decay: 0.1 -> 0.05\); rerun with changed=retrain"),
    Case("46.5 deleted record", "stage_args.json deleted and the recipe changed",
         lost_record(Path.unlink), r"its record stage_args.json is missing or unreadable"),
    Case("46.5 corrupt record", "stage_args.json cut short and the recipe changed",
         lost_record(lambda p: p.write_text('{"args": [')), r"stage_args.json is missing or unreadable"),
    Case("46.5 data", "the stage's data folder prepared again with other settings",
         reprepared_data, r"does not match .*\(data folder .*tiny: fingerprint [0-9a-f]{12} -> [0-9a-f]{12}\)"),
    Case("46.6", "an Optuna sweep continued with stage.total_steps=3 after 4",
         continued_sweep, r"ran its 1 trial with other fixed settings \(stage.total_steps: 4 -> 3\)"),
    Case("46.6 unrecorded", "an Optuna sweep continued on a study that does not record its settings",
         unrecorded_sweep, r"does not record the settings its 1 trial ran with"),
    Case("46.6 legacy folder", "a sweep folder from before the journal continued with other fixed settings",
         legacy_sweep_folder, r"trial folder .*/0 of the sweep in .* ran with other fixed settings "
                              r"\(stage.total_steps: 4 -> 3\)"),
    Case("46.9 overrides.yaml", "a trial's .hydra/overrides.yaml holding other things than strings",
         overrides_not_strings, r"^params None$"),
    Case("46.7", "a .jsonl.gz corpus", gzipped_jsonl, r"^read as json$"),
    Case("46.7 misnamed", "gzip bytes named .jsonl", gzip_named_plain,
         r"is gzip-compressed but named corpus.jsonl; name it \.\.\.\.gz"),
    Case("46.7 zstd", "zstd-compressed bytes (no zstandard installed)", zstd_bytes,
         r"corpus.jsonl is zstd-compressed, which this environment does not read; decompress it"),
    Case("46.8 shard", "prepare_data data.num_shards=2 data.shard_index=0 (data/README.md)",
         shard_summary, r'"shard": "0 of 2"'),
    Case("46.8 oc.env", "an unset ${oc.env:...} in a path",
         unset_env, r"^error: data_dir: environment variable ANCHORMASS_UNSET_46 is not set"),
    Case("46.8 symlink", "evaluate into a symlinked out_dir with overwrite=true",
         linked_out_dir, r"^error: out_dir .*link is a symbolic link"),
    Case("46.8 journal line", "a malformed line in optuna_study.jsonl",
         journal_with('["set_trial_state", [0'), r"optuna_study.jsonl line 3 is not a study record"),
    Case("46.8 journal op", "a journal line naming a method to call",
         journal_with('["__setattr__", ["path", "/etc"]]'), r"line 3 is not a study record .*not an operation"),
    Case("46.8 vocab evaluate", "evaluate a checkpoint claiming vocab_size=2**40",
         huge_vocab_evaluate, r"describes embed.weight of shape \(1099511627776, 128\), but the file holds one of "
                              r"shape \(400, 128\)"),
    Case("46.8 vocab export", "export a checkpoint claiming vocab_size=2**40",
         huge_vocab_export, r"refusing to build a model it does not hold"),
    Case("46.8 nan compared", "compare a nan-weight checkpoint with a good one",
         nan_compared, r"^error: compare model \(.*bad.ckpt\) has 1 non-finite weights .*: a comparison with it"),
    Case("46.8 nan alone", "evaluate a nan-weight checkpoint alone",
         nan_alone, r"warning: model A \(.*bad.ckpt\) has 1 non-finite weights .* every score it gets will be nan"),
    Case("46.8 nan scores compared", "a comparison whose results hold a nan score",
         nan_scores(models=2), r"^exit 1: error: the comparison has scores that are not finite numbers "
                               r"\(ppl: a/ctx64/ppl=nan\)"),
    Case("46.8 nan scores alone", "one model's results hold a nan score",
         nan_scores(models=1), r"^exit 0: warning: scores that are not finite numbers \(ppl: a/ctx64/ppl=nan\)"),
    Case("46.8 nan statistics", "paired statistics over nan scores",
         nan_paired_statistics, r"p nan \(non-finite\), holm nan"),
    Case("46.9 aggregate twice", "eval.aggregate inputs=[a.json,a.json] seeds=[0,1]",
         aggregate_inputs(link=False), r"a.json is given twice; each seed's results must be its own"),
    Case("46.9 aggregate link", "eval.aggregate of a results.json and a link to it",
         aggregate_inputs(link=True), r"b.json is given twice \(as .*a.json\)"),
    Case("46.9 runs_root", "run_curriculum runs_root with a comma",
         comma_runs_root, r"runs_root/<curriculum> '.*runs,old/mini' cannot be passed on as one path"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case, tmp_path, monkeypatch, capsys):
    text = case.run(tmp_path, monkeypatch, capsys)
    assert "Traceback" not in text
    if text.startswith("error:"):
        assert "\n" not in text.strip(), text
    assert re.search(case.must, text), f"{case.tried}: {text}"


def test_the_architecture_page_lists_every_input_read_from_elsewhere():
    """docs/architecture.md's list of inputs names the files the project reads back (46.9)."""
    page = (CHECKOUT / "docs" / "architecture.md").read_text(encoding="utf-8")
    inputs = page[page.index("## Inputs read from elsewhere"):]
    for name in ("optuna_study.jsonl", "stage_args.json", ".hydra/overrides.yaml"):
        assert name in inputs, name
