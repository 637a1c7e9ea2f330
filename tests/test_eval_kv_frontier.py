"""suite=kv_frontier: training-free methods on one Standard model's weights at equal stored bytes,
AnchorMass variants made from those weights (global KV groups by retrieval score or by index), the
measured merge ratio, and a rerun that continues from the finished rows."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from _gqa_helpers import gqa_config
from _passkey_helpers import passkey_tokenizer

from anchormass.data.token_file import write_tokens
from anchormass.errors import ConfigError
from anchormass.eval.runner import run_evaluation
from anchormass.eval.suite import EvalModel
from anchormass.eval.suites.kv_frontier.variants import Variant, build_variant, chosen_groups
from anchormass.models import build_model

ROOT = Path(__file__).resolve().parents[1]

CFG = {"lengths": [256], "batch_size": 2, "chunk": 128,
       "passkey": {"lang": "en", "filler": "classic_en", "depths": [0.2, 0.8], "seeds": [0], "new_tokens": 4},
       "probe": {"length": 192, "seeds": [100]},
       "anchormass": {"shares": [1, 2], "selections": ["retrieval", "index"], "group_sizes": [1, 8],
                      "outliers": [True], "no_outlier_group_sizes": [8], "oracle_group_sizes": [8]},
       "kv_policies": ["snapkv", "h2o", "streaming_llm"],
       "policy_args": {"snapkv": {"window": 8, "kernel": 5, "pooling": "avg"}}}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    tok = passkey_tokenizer(tmp_path_factory.mktemp("kv_frontier"))
    torch.manual_seed(0)
    model = build_model(gqa_config("standard", vocab_size=400)).eval()
    return tok, EvalModel("standard_gqa", model, model.cfg, "random-init")


def test_anchormass_from_a_standards_weights_keeps_its_tensors_and_reorders_whole_groups(assets):
    _, m = assets
    scores = torch.tensor([[0.1, 0.9, 0.3, 0.2], [0.5, 0.1, 0.4, 0.8]])
    assert chosen_groups(scores, 2, "retrieval") == [[1, 2], [0, 3]]
    assert chosen_groups(scores, 1, "index") == [[3], [3]]
    am = build_variant(m.model, Variant(1, "retrieval", 8, True), chosen_groups(scores, 1, "retrieval"))
    assert am.cfg.arch == "anchormass" and am.cfg.n_global_heads == 2 and am.cfg.group_size == 8
    k_std, k_am = m.model.blocks[0].attn.k_proj.weight, am.blocks[0].attn.k_proj.weight
    rows = m.model.cfg.head_dim
    assert torch.equal(k_am[-rows:], k_std[rows:2 * rows])  # layer 0's group 1 (the top score) is now last
    assert sum(p.numel() for p in am.parameters()) == sum(p.numel() for p in m.model.parameters())


def test_every_method_on_identical_trials_at_the_bytes_of_each_anchormass_cell(tmp_path, assets):
    tok, m = assets
    work = tmp_path / "work"
    write_tokens(tmp_path / "val.bin", np.random.default_rng(0).integers(0, 400, 600), vocab_size=400)
    ppl = {"data": str(tmp_path / "val.bin"), "contexts": [0, 64], "target_len": 32, "n_anchors": 3,
           "cells": ["am/retrieval1/g8"]}
    cfg = {"suite": "kv_frontier", "out_dir": str(tmp_path / "out"), "progress": False,
           "eval": {"kv_frontier": {**CFG, "work_dir": str(work), "ppl": ppl}}}
    out = run_evaluation(cfg, models=[m], tokenizer=tok)
    res = json.loads((out / "results.json").read_text())["suites"]["kv_frontier"]
    rows = res["rows"]
    cells = {r["method"] for r in rows if r["method"].startswith("am/")}
    assert len(cells) == 2 * 2 * 4  # shares x selections x (g1, g8, g8 without outliers, g8 oracle)
    assert all(r["n"] == 2 for r in rows)
    full = next(r for r in rows if r["method"] == "standard/full")
    by = {r["method"]: r for r in rows if r["method"].startswith("am/")}
    # the measured merge ratio: lossless at g1; at g8 between 4 (an outlier in every group) and 8
    assert by["am/retrieval1/g1"]["tokens_per_slot"] == pytest.approx(1.0)
    assert 4.0 <= by["am/retrieval1/g8"]["tokens_per_slot"] <= 8.0
    assert by["am/retrieval1/g8/no-out"]["tokens_per_slot"] == pytest.approx(8.0)
    assert by["am/retrieval1/g8"]["stored"] < by["am/retrieval1/g1"]["stored"] < full["stored"]
    # the oracle (evaluation only) can only add outlier slots, and gets no baselines of its own
    assert by["am/retrieval1/g8/oracle"]["tokens_per_slot"] <= by["am/retrieval1/g8"]["tokens_per_slot"]
    # each distinct byte level (share, g, outliers) gets every KV policy at its bytes, once
    levels = {r["level"] for r in rows if r["method"].startswith("ours/")}
    assert len(levels) == 2 * 3 and all(level.startswith("am/retrieval") for level in levels)
    for r in rows:
        if r["method"].startswith("ours/") and not r.get("note"):
            ref = by[r["level"]]
            assert abs(r["stored"] / ref["stored"] - 1) <= 0.1, (r["method"], r["stored"], ref["stored"])
    # perplexity: the full cache and the chosen cell on the same anchors, every prior context
    nll = res["ppl"]["nll"]
    assert sorted(nll) == ["am/retrieval1/g8", "standard/full"]
    assert all(len(nll[m][c]) == 3 for m in nll for c in ("0", "64"))
    assert nll["am/retrieval1/g8"]["64"] != nll["standard/full"]["64"]  # the cell compresses 64 prior tokens
    text = (out / "report.md").read_text()
    assert "### 256 tokens" in text and "tokens per global slot" in text and "Held-out perplexity" in text
    # a rerun continues: every row comes from the journal, nothing is decoded again
    lines = (work / "rows.jsonl").read_text().splitlines()
    out2 = run_evaluation({**cfg, "out_dir": str(tmp_path / "out2")}, models=[m], tokenizer=tok)
    again = json.loads((out2 / "results.json").read_text())["suites"]["kv_frontier"]["rows"]
    assert (work / "rows.jsonl").read_text().splitlines() == lines
    assert [r["answers"] for r in again] == [r["answers"] for r in rows]
    # only_finished reports the journal and names what it lacks, running nothing
    lines.pop()  # as if the run had stopped before its last row
    (work / "rows.jsonl").write_text("\n".join(lines) + "\n")
    only = {**cfg, "out_dir": str(tmp_path / "out3")}
    only["eval"] = {"kv_frontier": {**cfg["eval"]["kv_frontier"], "only_finished": True}}
    part = json.loads((run_evaluation(only, models=[m], tokenizer=tok) / "results.json").read_text())
    part = part["suites"]["kv_frontier"]
    assert len(part["rows"]) == len(rows)  # the journal's last row was the cell's ppl at the longest context
    missing = part["settings"]["not_run_yet"]
    assert len(missing) == 1 and missing[0].startswith("ppl/") and missing[0].endswith("/96/am/retrieval1/g8")
    assert "64" not in part["ppl"]["nll"]["am/retrieval1/g8"]  # the stopped row is named, not shown
    assert (work / "rows.jsonl").read_text().splitlines() == lines


KVPRESS_PYTHON = ROOT / ".venv-kvpress" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.skipif(not KVPRESS_PYTHON.is_file(), reason="needs kvpress's own environment (make kvpress-env)")
def test_kvpress_answers_the_same_prompts_and_its_snapkv_agrees_with_ours(tmp_path, assets):
    """kvpress's SnapKV with our SnapKV's settings keeps as many prompt tokens and answers the same
    trials; the report pairs them item by item."""
    tok, m = assets
    kvp = {"python": str(KVPRESS_PYTHON), "pairs": {"SnapKVPress": "snapkv"},
           "presses": [{"press": "SnapKVPress", "kwargs": {"window_size": 8, "kernel_size": 5}}]}
    cfg = {**CFG, "anchormass": {**CFG["anchormass"], "shares": [1], "selections": ["retrieval"],
                                 "no_outlier_group_sizes": []}, "kv_policies": ["snapkv"], "kvpress": kvp,
           "work_dir": str(tmp_path / "work")}
    out = run_evaluation({"suite": "kv_frontier", "out_dir": str(tmp_path / "out"), "progress": False,
                          "eval": {"kv_frontier": cfg}}, models=[m], tokenizer=tok)
    rows = json.loads((out / "results.json").read_text())["suites"]["kv_frontier"]["rows"]
    for level in ("am/retrieval1/g1", "am/retrieval1/g8"):
        ours = next(r for r in rows if r["level"] == level and r["method"] == "ours/snapkv")
        press = next(r for r in rows if r["level"] == level and r["method"] == "kvpress/SnapKVPress")
        assert press["kept"] == ours["budget"]  # the same prompt tokens per KV head
        assert press["answers"] == ours["answers"]
    assert "Agreement with kvpress" in (out / "report.md").read_text()


def test_a_row_depends_on_the_prefill_chunk_only_where_the_chunk_cuts_its_prompt():
    """A prompt no longer than the chunk is prefilled whole, so growing the chunk keeps such rows;
    a longer prompt prefilled in pieces is another measurement (StreamingLLM and H2O evict per
    chunk) and is run again."""
    from anchormass.eval.suites.kv_frontier import KvFrontierSuite

    suite = KvFrontierSuite.__new__(KvFrontierSuite)
    suite._settings = {"model": "abc", "passkey": {"lang": "en"}, "new_tokens": 8}
    suite.chunk = 1024
    short, long = suite.settings_key(1024), suite.settings_key(2048)
    suite.chunk = 16384
    assert suite.settings_key(1024) == short
    assert suite.settings_key(2048) != long
    suite.chunk = 512
    assert suite.settings_key(1024) != short


def test_perplexity_refuses_lengths_where_the_cache_would_merge_but_the_parallel_forward_would_not():
    from anchormass.eval.suites.kv_frontier.perplexity import check_budget

    check_budget("am/x/g8", 8, 64, 8 * 64)  # 511 tokens after the sink: 63 slots
    with pytest.raises(ConfigError, match="merge slots under its budget"):
        check_budget("am/x/g8", 8, 64, 8 * 64 + 1)


def test_a_trained_anchormass_checkpoint_is_scored_on_the_same_trials_and_journaled_by_its_bytes(tmp_path, assets):
    """`trained: {label: ckpt}` (a retrofit cell): scored like the made-up cells on the same trials (a
    checkpoint holding exactly a cell's weights answers exactly as that cell), journaled under its
    sha256 (a replaced file is scored again), and a checkpoint of other shapes is refused in one line."""
    from anchormass.training.checkpoint import STATE_PREFIX, atomic_torch_save

    tok, m = assets
    zeros = torch.zeros(m.model.cfg.n_layers, m.model.cfg.kv_heads)
    cell = build_variant(m.model, Variant(1, "index", 8, True), chosen_groups(zeros, 1, "index"))

    def save(model, path, step=90):
        atomic_torch_save({"state_dict": {STATE_PREFIX + k: v for k, v in model.state_dict().items()},
                           "global_step": step,
                           "hyper_parameters": {"model_config": model.cfg.to_dict(), "total_steps": 90}}, path)
        return str(path)

    ckpt = save(cell, tmp_path / "cell.ckpt")
    work = tmp_path / "work"
    settings = {**CFG, "work_dir": str(work), "kv_policies": [], "trained": {"g8": ckpt},
                "anchormass": {**CFG["anchormass"], "shares": [1], "selections": ["index"], "group_sizes": [8],
                               "no_outlier_group_sizes": [], "oracle_group_sizes": []}}
    cfg = {"suite": "kv_frontier", "out_dir": str(tmp_path / "out"), "progress": False,
           "eval": {"kv_frontier": settings}}
    rows = json.loads((run_evaluation(cfg, models=[m], tokenizer=tok) / "results.json").read_text())
    by = {r["method"]: r for r in rows["suites"]["kv_frontier"]["rows"]}
    assert by["trained/g8"]["answers"] == by["am/index1/g8"]["answers"]
    assert by["trained/g8"]["stored"] == by["am/index1/g8"]["stored"]
    assert "g8 step 90 of 90, sha256" in (tmp_path / "out" / "report.md").read_text()
    with torch.no_grad():
        cell.blocks[0].attn.q_proj.weight.mul_(2.0)
    save(cell, tmp_path / "cell.ckpt", step=15)  # a stage still training: scored, and said so
    got = json.loads((run_evaluation({**cfg, "out_dir": str(tmp_path / "out2")}, models=[m], tokenizer=tok)
                      / "results.json").read_text())["suites"]["kv_frontier"]["settings"]["trained"]["trained/g8"]
    assert (got["step"], got["total_steps"]) == (15, 90)
    assert "g8 step 15 of 90 (mid-run)" in (tmp_path / "out2" / "report.md").read_text()
    keys = [json.loads(line)["key"] for line in (work / "rows.jsonl").read_text().splitlines()]
    assert len([k for k in keys if "/trained/g8/" in k]) == 2  # one row per checkpoint content
    other = build_model(gqa_config("anchormass", vocab_size=400, ffn_dim=64))
    bad = {**cfg, "out_dir": str(tmp_path / "out3"),
           "eval": {"kv_frontier": {**settings, "trained": {"x": save(other, tmp_path / "x.ckpt")}}}}
    with pytest.raises(Exception, match="other shapes than expected.*ffn_dim: 64 vs"):
        run_evaluation(bad, models=[m], tokenizer=tok)


@pytest.mark.slow
@pytest.mark.skipif(not KVPRESS_PYTHON.is_file(), reason="needs kvpress's own environment (make kvpress-env)")
def test_kvpress_runner_answers_every_press_from_one_prefill_as_from_its_own(tmp_path, assets):
    """The runner's shared prefill (one forward, each press compressing its own copy of every layer's
    keys and values) answers exactly as kvpress's own context manager, press by press; the query-blocked
    kernel that gives ObservedAttention its weights answers as transformers' eager kernel."""
    from anchormass.eval.suites.kv_frontier import peer

    tok, m = assets
    folder = peer.export_folder(m.model, tok.special_ids(), tmp_path)
    gen = torch.Generator().manual_seed(5)
    items = [{"id": str(i), "prompt_ids": torch.randint(3, 400, (96,), generator=gen).tolist()} for i in range(2)]
    presses = [{"label": name, "press": name, "kwargs": {"compression_ratio": 0.6, **kwargs}} for name, kwargs in
               [("SnapKVPress", {"window_size": 8}), ("StreamingLLMPress", {"n_sink": 4}),
                ("ObservedAttentionPress", {}), ("KnormPress", {}), ("TOVAPress", {})]]
    answers = {}
    for shared, kernel in (("true", "blocked"), ("false", "blocked"), ("true", "eager")):
        spec, out = tmp_path / f"items_{shared}_{kernel}.json", tmp_path / f"answers_{shared}_{kernel}.json"
        spec.write_text(json.dumps({"model": str(folder), "max_new_tokens": 5, "presses": presses, "items": items}))
        subprocess.run([str(KVPRESS_PYTHON), str(ROOT / peer.RUNNER), f"items={spec}", f"out={out}",
                        f"shared={shared}", f"weights_kernel={kernel}"], check=True, capture_output=True)
        answers[shared, kernel] = json.loads(out.read_text())["answers"]
    assert answers["true", "blocked"] == answers["false", "blocked"]
    # ObservedAttention (and the SDPA presses beside it) answer alike under transformers' eager kernel
    assert answers["true", "blocked"] == answers["true", "eager"]
    kept = {name: got["0"]["kept"][0] for name, got in answers["true", "blocked"].items()}
    assert all(k < 96 for k in kept.values()), kept  # every press compressed


def test_the_standards_methods_share_a_whole_prompt_prefill_and_score_as_one_session_each(tmp_path, assets,
                                                                                         monkeypatch):
    """With the whole prompt in one forward, the full cache and every policy at every level come from
    one prefill per batch; the rows equal those of one session per method."""
    import anchormass.eval.suites.kv_frontier as suite
    from anchormass.eval.scoring import session_decode

    tok, m = assets
    cfg = {**CFG, "chunk": 512, "anchormass": {**CFG["anchormass"], "shares": [1], "selections": ["retrieval"],
                                               "oracle_group_sizes": []}}
    calls = []
    real = suite.shared_session_decode
    monkeypatch.setattr(suite, "shared_session_decode", lambda *a, **k: calls.append(len(a[4])) or real(*a, **k))

    def rows_of(name):
        out = run_evaluation({"suite": "kv_frontier", "out_dir": str(tmp_path / name), "progress": False,
                              "eval": {"kv_frontier": {**cfg, "work_dir": str(tmp_path / f"work_{name}")}}},
                             models=[m], tokenizer=tok)
        rows = json.loads((out / "results.json").read_text())["suites"]["kv_frontier"]["rows"]
        return {(r["level"], r["method"]): (r["answers"], r["stored"]) for r in rows}

    shared = rows_of("shared")
    assert calls == [1 + 3 * 3]  # one batch of both trials: the full cache, 3 policies x 3 byte levels
    monkeypatch.setattr(suite, "shared_session_decode", lambda model, ids, n, chunk, settings, vocab_limit: [
        session_decode(model, ids, n, chunk, policy, budget, vocab_limit=vocab_limit) for policy, budget in settings])
    assert rows_of("alone") == shared


def test_the_method_by_length_table_shows_each_lengths_recall_bytes_and_measured_ratio():
    from anchormass.eval.suites.kv_frontier import _stats, by_length

    def row(L, method, level, k, stored, ratio=None):
        exact = [True] * k + [False] * (15 - k)
        return {"length": L, "method": method, "level": level, "k": k, "n": 15, "exact": exact, "stored": stored,
                "tokens_per_slot": ratio}

    rows = _stats([row(1024, "standard/full", "full", 15, 1024 * 1024), row(2048, "standard/full", "full", 14, 2 << 20),
                   row(1024, "am/r2/g8", "am/r2/g8", 0, 1 << 18, 4.0)])
    table = by_length(rows, [1024, 2048]).splitlines()
    full = next(line for line in table if "standard/full" in line)
    assert "15/15 [80, 100] · 1,024 KiB" in full and "14/15 [70, 99] · 2,048 KiB" in full
    cell = next(line for line in table if "am/r2/g8" in line)
    assert "0/15 [0, 20] · 256 KiB, 4.00:1" in cell and cell.rstrip(" |").endswith("-")  # not run at 2,048


def test_a_row_killed_between_batches_continues_from_its_finished_trials(tmp_path, assets, monkeypatch):
    """Each finished batch is journaled as a part of its row: a run killed inside a row keeps the trials it
    finished, and the rerun decodes only the rest, ending with the rows an unbroken run gives."""
    import anchormass.eval.suites.kv_frontier as suite

    tok, m = assets
    cfg = {**CFG, "batch_size": 1, "anchormass": {**CFG["anchormass"], "shares": [1], "selections": ["retrieval"],
                                                  "group_sizes": [8], "no_outlier_group_sizes": [],
                                                  "oracle_group_sizes": []}}

    def rows_of(name, work):
        out = run_evaluation({"suite": "kv_frontier", "out_dir": str(tmp_path / name), "progress": False,
                              "eval": {"kv_frontier": {**cfg, "work_dir": str(work)}}}, models=[m], tokenizer=tok)
        return json.loads((out / "results.json").read_text())["suites"]["kv_frontier"]["rows"]

    whole = rows_of("whole", tmp_path / "work_whole")
    calls, real = [], suite.session_decode

    per_trial = 1 + 3  # the full cache and three policies at the cell's bytes, one session each (chunk < prompt)

    def killed_in_the_second_batch(*a, **k):  # the cell's two trials, the Standard's first batch, then a kill
        calls.append(1)
        if len(calls) == 2 + per_trial + 1:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(suite, "session_decode", killed_in_the_second_batch)
    with pytest.raises(KeyboardInterrupt):
        rows_of("killed", tmp_path / "work")
    calls.clear()
    monkeypatch.setattr(suite, "session_decode", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = rows_of("again", tmp_path / "work")
    assert len(calls) == per_trial  # the cell's row and the Standard's first trial were kept: one trial ran
    assert again == whole



def test_a_rows_bytes_and_ratio_weigh_each_batch_by_its_trials():
    """Batches of 2 and 1 trials (15 trials in batches of 8 and 7 alike): the per-trial mean, not the
    mean of the batch means. Every trial of one length stores the same bytes in today's methods, so
    this guards the methods whose bytes will depend on the prompt."""
    from anchormass.eval.suites.kv_frontier import trial_mean

    assert trial_mean([(10.0, 2), (1.0, 1)]) == pytest.approx(7.0)
    assert trial_mean([(4.0, 8), (4.0, 7)]) == 4.0
