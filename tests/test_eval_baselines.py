"""Hit-rate probe against a brute-force count; the hitrate and baselines suites end to end on
random-init tiny models (tiny sizes: these check plumbing and invariants, not quality)."""

import copy
import json

import numpy as np
import pytest
import torch

from anchormass.cache.kv_policies import SnapKV, attention_probs
from anchormass.cache.standard_cache import StandardLayerCache
from anchormass.eval.baselines import kv_bytes_per_token, session_logprobs
from anchormass.eval.hitrate import HitRateProbe
from anchormass.models import build_model

B, H, D = 2, 3, 8


def test_hit_rate_probe_counts_match_brute_force_and_change_nothing():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, 40, D, generator=g) * s for s in (3.0, 3.0, 1.0))  # peaky attention
    probe = HitRateProbe(window=4, kernel=3, threshold=0.05).bind(12)
    watched, full = StandardLayerCache(H, D, B, probe), StandardLayerCache(H, D, B)
    outs = []
    for layer in (watched, full):
        o = [layer.attend(q[:, :, :30], k[:, :, :30], v[:, :, :30])]
        layer.end_prefill()
        o += [layer.attend(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1]) for t in range(30, 40)]
        outs.append(torch.cat(o, dim=2))
    assert torch.equal(outs[0], outs[1])  # the probe only watches
    assert watched.length == 40

    chosen = SnapKV(window=4, kernel=3).bind(12).select(q[:, :, 26:30], k[:, :, :30])[..., :8]  # prefix picks
    hits = np.zeros((B, H))
    important = np.zeros((B, H))
    for t in range(30, 40):
        probs = attention_probs(q[:, :, t:t + 1], k[:, :, : t + 1], first_query_slot=t)[:, :, 0, :26]
        for b in range(B):
            for h in range(H):
                imp = set(torch.nonzero(probs[b, h] > 0.05).flatten().tolist())
                important[b, h] += len(imp)
                hits[b, h] += len(imp & set(chosen[b, h].tolist()))
    assert important.sum() > 0 and 0 < hits.sum() < important.sum()
    np.testing.assert_array_equal(watched.state["hit_hits"].numpy(), hits)
    np.testing.assert_array_equal(watched.state["hit_important"].numpy(), important)


@pytest.fixture(scope="module")
def tiny_models():
    torch.manual_seed(0)
    return build_model("standard_tiny").eval(), build_model("anchormass_tiny").eval()


def test_session_logprobs_equal_the_parallel_forward_and_policies_cut_bytes(tiny_models):
    std, _ = tiny_models
    ids = torch.randint(0, std.cfg.vocab_size, (1, 60), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = torch.log_softmax(std(ids)[:, 47:-1].float(), -1).gather(-1, ids[:, 48:, None])[..., 0]
    full, full_bytes = session_logprobs(std, ids, 47, 16, 1)
    torch.testing.assert_close(full, ref, atol=1e-4, rtol=0)
    per_token = kv_bytes_per_token(std)
    assert per_token == 2 * std.cfg.n_layers * std.cfg.n_heads * std.cfg.head_dim * 4  # K+V, fp32
    for policy in ("h2o", "streaming_llm"):
        lp, nbytes = session_logprobs(std, ids, 47, 16, 1, policy, 24)
        assert lp.shape == full.shape and nbytes < full_bytes / 2
        assert not torch.allclose(lp, full)


def _run(tmp_path, models, eval_cfg, suite):
    from anchormass.eval.runner import run_evaluation
    from anchormass.eval.suite import EvalModel

    wrapped = [EvalModel(label=m.cfg.name, model=m, config=m.cfg, source=f"random-init:{m.cfg.name}") for m in models]
    out = run_evaluation({"suite": suite, "out_dir": str(tmp_path / suite), "progress": False, "eval": eval_cfg},
                         models=wrapped)
    return out, json.loads((out / "results.json").read_text())["suites"][suite]


def test_baselines_suite_matches_bytes_and_reports(tmp_path, tiny_models):
    std, am = tiny_models
    cfg = {"baselines": {"slot_budgets": [4], "policy_args": {"snapkv": {"window": 8}},
                         "ppl": {"contexts": [300], "target_len": 4, "n_anchors": 1}, "chunk": 256}}
    out, res = _run(tmp_path, [std, am], cfg, "baselines")
    rows = {r["method"]: r for r in res["rows"]}
    assert set(rows) == {"anchormass", "snapkv", "h2o", "streaming_llm", "full"}
    per_token = res["settings"]["standard_kv_bytes_per_token"]
    matched = int(rows["anchormass"]["kv_bytes"] // per_token)
    assert 8 < matched < 300  # AnchorMass at 304 tokens is smaller than a full Standard cache
    for p in ("snapkv", "h2o", "streaming_llm"):
        assert rows[p]["budget"] == matched
        assert rows[p]["kv_bytes"] < rows["full"]["kv_bytes"]
    assert (out / "baselines_score_vs_kv_bytes.png").stat().st_size > 0
    assert "equal KV bytes" in (out / "report.md").read_text()


def test_baselines_with_a_covering_token_budget_equal_the_full_cache(tmp_path, tiny_models):
    std, _ = tiny_models
    cfg = {"baselines": {"token_budgets": [64], "policy_args": {"snapkv": {"window": 8}},
                         "ppl": {"contexts": [40], "target_len": 8, "n_anchors": 2}}}
    _, res = _run(tmp_path, [std], cfg, "baselines")
    rows = {r["method"]: r for r in res["rows"]}
    assert res["settings"]["level_kind"] == "tokens"
    for p in ("snapkv", "h2o", "streaming_llm"):
        assert rows[p]["score"] == rows["full"]["score"]  # nothing evicted: identical logits


def test_hitrate_suite_end_to_end(tmp_path, tiny_models):
    std = copy.deepcopy(tiny_models[0])
    with torch.no_grad():  # sharpen attention so some positions exceed the 0.05 threshold
        for block in std.blocks:
            block.attn.q_proj.weight.mul_(6.0)
            block.attn.k_proj.weight.mul_(6.0)
    cfg = {"hitrate": {"lengths": [80], "n_prompts": 1, "budget": 24, "window": 8, "new_tokens": 4}}
    out, res = _run(tmp_path, [std], cfg, "hitrate")
    rate = np.array(res["models"]["standard_tiny"]["hit_rate"], dtype=float)
    assert rate.shape == (std.cfg.n_layers, std.cfg.n_heads)
    hits = np.array(res["models"]["standard_tiny"]["hits"])
    important = np.array(res["models"]["standard_tiny"]["important"])
    assert important.sum() > 0 and (hits <= important).all()
    assert 0.0 <= res["summary"]["standard_tiny/hit_rate_mean"] <= 1.0
    assert (out / "hitrate_standard_tiny.png").stat().st_size > 0


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A small tokenizer and a val.bin made with it."""
    from anchormass.data.token_file import write_tokens
    from anchormass.data.tokenizer import train_tokenizer
    from anchormass.eval.haystack import CLASSIC_JA, PHRASINGS

    d = tmp_path_factory.mktemp("baselines_assets")
    texts = [CLASSIC_JA * 3] + [" ".join(v) for v in PHRASINGS["ja"].values()] + ["0123456789 パスキー"] * 3
    tok = train_tokenizer(texts, d / "tok.model", vocab_size=400, hard_vocab_limit=False)
    write_tokens(d / "val.bin", np.random.default_rng(0).integers(4, tok.vocab_size, size=400),
                 tok.vocab_size, {"tokenizer_checksum": tok.checksum})
    return d, tok


def test_baselines_passkey_and_token_file(tmp_path, tiny_models, assets):
    from anchormass.eval.runner import run_evaluation
    from anchormass.eval.suite import EvalModel

    data_dir, tok = assets
    std, _ = tiny_models
    cfg = {"baselines": {"token_budgets": [40], "policies": ["streaming_llm", "snapkv"],
                         "policy_args": {"snapkv": {"window": 8}},
                         "ppl": {"contexts": [64], "target_len": 8, "n_anchors": 1},
                         "passkey": {"lengths": [120], "depths": [0.5], "seeds": [0, 1], "new_tokens": 4}}}
    out = run_evaluation({"suite": "baselines", "out_dir": str(tmp_path / "out"), "progress": False, "eval": cfg,
                          "data_dir": str(data_dir)},
                         models=[EvalModel("standard_tiny", std, std.cfg, "random-init")], tokenizer=tok)
    results = json.loads((out / "results.json").read_text())
    res = results["suites"]["baselines"]
    assert any(d["path"].endswith("val.bin") for d in results["data"].values())
    keys = {(r["task"], r["method"]) for r in res["rows"]}
    assert keys == {(t, m) for t in ("ppl", "passkey") for m in ("streaming_llm", "snapkv", "full")}
    passkey = [it for it in res["items"] if it["task"] == "passkey"]
    assert len(passkey) == 2 * 3 and all(0 <= it["digits"] <= 4 and "text" in it for it in passkey)
    bytes_ = {r["method"]: r["kv_bytes"] for r in res["rows"] if r["task"] == "passkey"}
    assert bytes_["streaming_llm"] < bytes_["snapkv"] < bytes_["full"]


def test_prompt_sources(assets):
    from anchormass.errors import ConfigError
    from anchormass.eval.baselines import prompt_source
    from anchormass.eval.suite import EvalContext

    data_dir, tok = assets
    ctx = EvalContext(models=[], tokenizer=None, device=torch.device("cpu"), data_dir=data_dir)
    src = prompt_source("tokens", ctx, "hitrate")
    a, b = src.prompt(50, seed=3, vocab=10), src.prompt(50, seed=3, vocab=10)
    assert torch.equal(a, b) and a.shape == (50,) and int(a.max()) < tok.vocab_size
    assert prompt_source(None, ctx, "hitrate").kind == "random"
    with pytest.raises(ConfigError, match="needs a tokenizer"):
        prompt_source("passkey", ctx, "hitrate")
    with pytest.raises(ConfigError, match="does not fit"):
        src.prompt(500, seed=0, vocab=10)
    ctx.tokenizer = tok
    assert len(prompt_source(None, ctx, "hitrate").prompt(90, seed=1, vocab=10)) == 90
