"""A cell that runs out of memory is missing from a suite's summary (what aggregation and the
curriculum's tables read), not scored `exact: 0.0` (issue 24); the cells that ran keep their score."""

import json
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import anchormass.eval.items as items
from anchormass.eval.runner import run_evaluation

from _train_helpers import tiny_datasets

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def out_of_memory_at_320(monkeypatch):
    real = items.generate

    def generate(model, ids, *args, **kwargs):
        if ids.shape[1] >= 320:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, ids, *args, **kwargs)

    monkeypatch.setattr(items, "generate", generate)


def test_oom_cells_are_missing_from_the_summary(tmp_path, out_of_memory_at_320):
    demo = tiny_datasets(tmp_path / "data")["pretrain"]
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("evaluate", overrides=["suite=[passkey,policies]", "model=anchormass_tiny",
                                             "model.vocab_size=400",
                                             f"tokenizer={demo / 'tokenizer.model'}", "eval.passkey.robustness=null",
                                             "eval.policies.budgets=[16]", "eval.policies.policies=[fifo]",
                                             f"out_dir={tmp_path / 'run'}", "progress=false"])
    res = json.loads((run_evaluation(cfg) / "results.json").read_text())["suites"]
    pk = res["passkey"]
    assert {r["status"] for r in pk["items"] if r["length"] == 320} == {"OOM"}
    assert set(pk["summary"]) == {"anchormass_tiny/len160/exact"}   # len320 ran out of memory: no score
    pol = res["policies"]                                            # its only cell is 320 tokens long
    assert pol["cells"][0]["oom"] == pol["cells"][0]["n"] and pol["summary"] == {}
