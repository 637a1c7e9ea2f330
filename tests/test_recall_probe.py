"""The recall probe (anchormass/training/recall_probe.py, scripts/recall_probe.py): its tasks mark
exactly the tokens recall can predict, it counts hits honestly, training moves the held-out loss,
and the script writes the curve and refuses bad input in one line."""

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from anchormass.errors import ConfigError
from anchormass.models import build_model
from anchormass.training.recall_probe import COPY_MARKS, ProbeConfig, RecallTask, evaluate, steps_to, train_probe

ROOT = Path(__file__).resolve().parents[1]
MQAR = {"vocab": {"keys": [256, 512], "values": [512, 768], "noise": [768, 1024]}, "n_pairs": 4, "alpha": 1.0}


def tiny(vocab=1024):
    torch.manual_seed(0)
    return build_model({"name": "probe", **_preset("standard_tiny"), "vocab_size": vocab, "n_layers": 1})


def _preset(name):
    from anchormass.models.config import read_preset

    return {k: v for k, v in read_preset(name).items() if k != "name"}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 1000), index=st.integers(0, 1000), lo=st.integers(1, 12), span=st.integers(0, 12))
def test_copy_rows_mask_exactly_the_repeats(seed, index, lo, span):
    cfg = ProbeConfig(task="copy", seq_len=96, copy={"ids": [100, 140], "min_len": lo, "max_len": lo + span})
    ids, mask = RecallTask(cfg, 1024)._row(seed, index)
    assert len(ids) == len(mask) == 97
    expected = np.zeros_like(mask)
    starts = np.flatnonzero(ids == COPY_MARKS[0])
    for a in starts:
        b = a + 1 + np.flatnonzero(ids[a + 1:] == COPY_MARKS[1])[0] if (ids[a + 1:] == COPY_MARKS[1]).any() else None
        if b is None:
            continue
        seg = ids[a + 1:b]
        rep = ids[b + 1:b + 1 + len(seg)]
        assert (rep == seg[:len(rep)]).all()  # the second saying repeats the first
        expected[b + 1:b + 1 + len(seg)] = True
    assert (mask == expected).all()
    assert ((ids[mask] >= 100) & (ids[mask] < 140)).all()


def test_items_are_deterministic_and_held_out_differs_from_training():
    task = RecallTask(ProbeConfig(task="mqar", seq_len=64, mqar=MQAR), 1024)
    a, b = task.batch(0, 10, 4), task.batch(0, 10, 4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(task.batch(1, 10, 4)[0], a[0])
    assert int(a[1].sum()) == 4 * 4  # one target per query


class Oracle(torch.nn.Module):
    """Puts all mass on the true next token: a perfect recaller (it reads the answer). Its hidden
    state is the one-hot next token and its LM head the identity, as the probe's loss reads a model."""

    def __init__(self, vocab, ids):
        super().__init__()
        self.vocab, self.ids = vocab, ids
        self.lm_head = torch.nn.Linear(vocab, vocab, bias=False)
        torch.nn.init.eye_(self.lm_head.weight)

    def forward_hidden(self, x):
        nxt = self.ids[:, 1:x.shape[1] + 1]
        return torch.nn.functional.one_hot(nxt, self.vocab).float() * 50


def test_evaluate_counts_hits_over_the_masked_targets_only():
    task = RecallTask(ProbeConfig(task="mqar", seq_len=64, mqar=MQAR), 1024)
    ids, mask = task.batch(3, 0, 6)
    perfect = evaluate(Oracle(1024, ids), task, (ids, mask), batch_size=6)
    assert perfect["hits"] == perfect["n"] == int(mask.sum()) and perfect["loss"] < 1e-6
    blind = evaluate(Oracle(1024, torch.zeros_like(ids)), task, (ids, mask), batch_size=6)
    assert blind["hits"] == 0 and blind["n"] == int(mask.sum())


def test_training_lowers_the_held_out_loss_and_records_every_eval():
    cfg = ProbeConfig(task="mqar", steps=12, batch_size=8, seq_len=64, lr=3e-3, warmup=2, eval_every=4,
                      eval_items=16, mqar=MQAR)
    records = train_probe(tiny(), cfg)
    assert [r["step"] for r in records] == [0, 4, 8, 12]
    assert records[-1]["loss"] < records[0]["loss"] - 0.5  # from ~ln(1024) toward the value range
    assert records[0]["chance"] == pytest.approx(1 / 256)
    assert steps_to(records, 2.0) is None and steps_to(records, 0.0) == 0


def test_bad_probe_settings_are_config_errors():
    with pytest.raises(ConfigError, match="task must be one of"):
        ProbeConfig(task="nope").check(1024)
    with pytest.raises(ConfigError, match="copy.ids"):
        ProbeConfig(task="copy", copy={"ids": [1000, 2000], "min_len": 1, "max_len": 2}).check(1024)
    with pytest.raises(ConfigError, match="steps must be >= 1"):
        ProbeConfig(steps=0).check(1024)


def test_script_writes_the_curve_and_refuses_bad_input(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "scripts/recall_probe.py", *a], cwd=ROOT,  # noqa: E731
                                    capture_output=True, text=True, timeout=300)
    ok = run("task=copy", "steps=4", "eval_every=2", "eval_items=4", "batch_size=4", "seq_len=48",
             "preset_set={n_heads: 8, head_dim: 16}", f"out={tmp_path}")
    assert ok.returncode == 0, ok.stderr
    rows = list(csv.DictReader(open(tmp_path / "curve.csv")))
    assert [int(r["step"]) for r in rows] == [0, 2, 4]
    assert (tmp_path / "curve.png").stat().st_size > 0
    bad = run("preset_set={n_hedas: 3}", f"out={tmp_path}")
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: model config: unknown field(s) ['n_hedas']")
    assert len(bad.stderr.strip().splitlines()) == 1
