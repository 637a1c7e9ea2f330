"""kv_frontier `journal_from`: a fresh work folder continues from a committed report. Its rows are
taken only under the same settings and the same weights (named by a checksum of the tensors, or, for
a report that predates it, by the retrieval probe measured again), so a rerun measures nothing twice
and never reuses a row measured otherwise."""

import json

import numpy as np
import pytest
import torch
from _gqa_helpers import gqa_config
from _passkey_helpers import passkey_tokenizer

from anchormass.data.token_file import write_tokens
from anchormass.errors import ConfigError
from anchormass.eval.runner import run_evaluation
from anchormass.eval.suite import EvalModel
from anchormass.eval.suites.kv_frontier.journal_seed import weights_key
from anchormass.models import build_model

SUITE = {"lengths": [256], "batch_size": 2, "chunk": 128,
         "passkey": {"lang": "en", "filler": "classic_en", "depths": [0.2, 0.8], "seeds": [0], "new_tokens": 4},
         "probe": {"length": 192, "seeds": [100]},
         "anchormass": {"shares": [2], "selections": ["retrieval"], "group_sizes": [8], "outliers": [True],
                        "no_outlier_group_sizes": [], "oracle_group_sizes": []},
         "kv_policies": ["snapkv"], "policy_args": {"snapkv": {"window": 8, "kernel": 5, "pooling": "avg"}}}


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """One finished run: its model, tokenizer, suite settings and results.json."""
    root = tmp_path_factory.mktemp("seed")
    tok = passkey_tokenizer(root)
    torch.manual_seed(0)
    model = build_model(gqa_config("standard", vocab_size=400)).eval()
    m = EvalModel("standard_gqa", model, model.cfg, "random-init")
    write_tokens(root / "val.bin", np.random.default_rng(0).integers(0, 400, 600), vocab_size=400)
    ppl = {"data": str(root / "val.bin"), "contexts": [0, 64], "target_len": 32, "n_anchors": 3,
           "cells": ["am/retrieval2/g8"]}
    settings = {**SUITE, "work_dir": str(root / "work"), "ppl": ppl}
    out = run_evaluation({"suite": "kv_frontier", "out_dir": str(root / "out"), "progress": False,
                          "eval": {"kv_frontier": settings}}, models=[m], tokenizer=tok)
    return m, tok, settings, out / "results.json"


def _render(tmp_path, first, report, **changes):
    """Only the journal of a new work folder seeded from `report`: what it shows and what it lacks."""
    m, tok, settings, _ = first
    cfg = {"suite": "kv_frontier", "out_dir": str(tmp_path / "render"), "progress": False,
           "eval": {"kv_frontier": {**settings, **changes, "work_dir": str(tmp_path / "fresh"),
                                    "only_finished": True, "journal_from": [str(report)]}}}
    return json.loads((run_evaluation(cfg, models=[m], tokenizer=tok) / "results.json").read_text())[
        "suites"]["kv_frontier"]


def test_a_fresh_work_folder_continues_from_a_committed_report(tmp_path, first):
    m, _, _, report = first
    before = json.loads(report.read_text())["suites"]["kv_frontier"]
    assert before["settings"]["weights"] == weights_key(m.model)
    got = _render(tmp_path, first, report)
    assert got["settings"]["not_run_yet"] == []
    assert got["rows"] == before["rows"] and got["ppl"]["nll"] == before["ppl"]["nll"]


def test_a_report_without_the_weights_key_is_taken_only_where_the_probe_measures_the_same(tmp_path, first):
    """A report from before the weights key: its model is ours when the recomputed probe equals its own."""
    report = json.loads(first[3].read_text())
    result = report["suites"]["kv_frontier"]
    del result["settings"]["weights"], result["ppl"]["key"]  # as an older report records them
    old = tmp_path / "old.json"
    old.write_text(json.dumps(report))
    got = _render(tmp_path / "a", first, old)
    assert got["settings"]["not_run_yet"] == [] and got["rows"] == result["rows"]
    assert got["ppl"]["nll"] == result["ppl"]["nll"]  # the same anchors, target length and token file
    result["settings"]["retrieval_scores"][0][0] += 1e-3  # other weights would measure another probe
    old.write_text(json.dumps(report))
    with pytest.raises(ConfigError, match="measured under other settings"):
        _render(tmp_path / "b", first, old)


def test_rows_measured_under_other_settings_are_not_taken(tmp_path, first):
    """Another number of answer tokens: no row of the report applies, and the run says so."""
    passkey = {**SUITE["passkey"], "new_tokens": 5}
    with pytest.raises(ConfigError, match="measured under other settings"):
        _render(tmp_path, first, first[3], passkey=passkey)



def test_only_finished_before_any_row_of_its_lengths_names_them_all_and_draws_nothing(tmp_path, first):
    """The report's rows are of another length: they join the journal, and this length's are named."""
    m, tok, settings, report = first
    got = _render(tmp_path, first, report, lengths=[320], ppl=None)
    assert got["rows"] == [] and got["plots"] == []
    assert {"320/standard/full", "320/am/retrieval2/g8"} <= set(got["settings"]["not_run_yet"])
