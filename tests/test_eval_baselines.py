"""Hit-rate probe against a brute-force count; the hitrate and baselines suites end to end on
random-init tiny models (tiny sizes: these check plumbing and invariants, not quality)."""

import copy
import json

import numpy as np
import pytest
import torch

from anchormass.cache.kv_policies import SnapKV, attention_probs
from anchormass.cache.standard_cache import StandardLayerCache
from anchormass.eval.scoring import session_logprobs, standard_bytes_per_token
from anchormass.eval.suites.hitrate import HitRateProbe
from anchormass.models import build_model

B, H, D = 2, 3, 8


@pytest.mark.parametrize("h_kv", [H, 1], ids=["mha", "gqa"])  # gqa: the 3 query heads share one KV head
def test_hit_rate_probe_counts_match_brute_force_and_change_nothing(h_kv):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, 40, D, generator=g) * s for h, s in ((H, 3.0), (h_kv, 3.0), (h_kv, 1.0)))
    probe = HitRateProbe(window=4, kernel=3, threshold=0.05).bind(12)
    watched, full = StandardLayerCache(h_kv, D, B, probe), StandardLayerCache(h_kv, D, B)
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
                hits[b, h] += len(imp & set(chosen[b, h // (H // h_kv)].tolist()))  # its KV head's picks
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
    per_token = standard_bytes_per_token(std)
    assert per_token == 2 * std.cfg.n_layers * std.cfg.n_heads * std.cfg.head_dim * 4  # K+V, fp32
    assert full_bytes.stored_end == 59 * per_token  # 48 prompt tokens + 11 fed (the last is only a target)
    for policy in ("h2o", "streaming_llm"):
        lp, kv = session_logprobs(std, ids, 47, 16, 1, policy, 24)
        assert lp.shape == full.shape and kv.stored_end == 24 * per_token
        assert kv.allocated_peak < full_bytes.allocated_peak / 2
        assert not torch.allclose(lp, full)


def _run(tmp_path, models, eval_cfg, suite):
    from anchormass.eval.runner import run_evaluation
    from anchormass.eval.suite import EvalModel

    wrapped = [EvalModel(label=m.cfg.name, model=m, config=m.cfg, source=f"random-init:{m.cfg.name}") for m in models]
    out = run_evaluation({"suite": suite, "out_dir": str(tmp_path / suite), "progress": False, "eval": eval_cfg},
                         models=wrapped)
    return out, json.loads((out / "results.json").read_text())["suites"][suite]


def test_baselines_suite_matches_stored_bytes_within_5_percent(tmp_path, tiny_models):
    """Every method at every level stores, after the last token, what AnchorMass stores (±5%):
    SnapKV is charged for the tokens it appends after compressing the prompt."""
    std, am = tiny_models
    cfg = {"baselines": {"slot_budgets": [4, 32], "policy_args": {"snapkv": {"window": 8}},
                         "ppl": {"contexts": [300], "target_len": 16, "n_anchors": 2}, "chunk": 256}}
    out, res = _run(tmp_path, [std, am], cfg, "baselines")
    per_token = res["settings"]["standard_bytes_per_token"]
    levels = {}
    for r in res["rows"]:
        levels.setdefault(r["level"], {})[r["method"]] = r
    assert set(levels) == {"full", "slots=4", "slots=32"} and set(levels["full"]) == {"full"}
    for level in ("slots=4", "slots=32"):
        rows = levels[level]
        assert set(rows) == {"anchormass", "snapkv", "h2o", "streaming_llm"}
        target = rows["anchormass"]["stored_end"]
        assert 8 * per_token < target < levels["full"]["full"]["stored_end"]
        for method, r in rows.items():
            assert abs(r["stored_end"] / target - 1) <= 0.05, (level, method, r["stored_end"], target)
            assert r["matched"] and r["allocated_peak"] >= r["stored_end"]
        # SnapKV keeps its budget of the prompt plus the 14 tokens fed after it
        assert rows["snapkv"]["budget"] == rows["h2o"]["budget"] - 14
    assert levels["slots=32"]["anchormass"]["stored_end"] > levels["slots=4"]["anchormass"]["stored_end"]
    assert res["settings"]["unmatched"] == []
    assert (out / "baselines_score_vs_kv_bytes.png").stat().st_size > 0
    report = (out / "report.md").read_text()
    assert "equal stored KV bytes" in report and "allocated KiB" in report


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
    from anchormass.eval.items import CLASSIC_JA, PHRASINGS

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
    rows = {r["method"]: r for r in res["rows"] if r["task"] == "passkey"}
    per_token = res["settings"]["standard_bytes_per_token"]
    for method in ("streaming_llm", "snapkv"):  # 40 tokens after the last of the 3 tokens fed
        assert rows[method]["stored_end"] == 40 * per_token and rows[method]["matched"]
    assert rows["snapkv"]["budget"] == 37 and rows["full"]["stored_end"] == 123 * per_token


def test_prompt_sources(assets):
    from anchormass.errors import ConfigError
    from anchormass.eval.suite import EvalContext
    from anchormass.eval.suites.hitrate import prompt_source

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


def test_stored_bytes_agree_with_the_independent_accounting(tiny_models):
    """cache.stored_nbytes counts what the design says a session keeps, not its buffers; the
    AnchorMass prefill headroom is given back at the end of the prefill."""
    from anchormass.cache import new_cache
    from anchormass.inference.generate import decode
    from anchormass.models.accounting import kv_bytes_session

    std, am = tiny_models
    ids = torch.randint(0, 1000, (1, 333), generator=torch.Generator().manual_seed(2))
    for model in (std, am):
        cache = new_cache(model, budget=8 if model is am else None)
        with torch.no_grad():
            for part in (ids[:, :256], ids[:, 256:]):  # two prefill chunks
                model(part, cache=cache)
            prefill_end = cache.nbytes
            cache.end_prefill()
        for step in range(2):
            n = cache.seen_tokens
            if model is am:
                want = sum(kv_bytes_session(am.cfg.replace(n_layers=1), n, budget=int(layer.counts.max()),
                                            dtype=torch.float32) for layer in cache.layers)
                assert all(int(layer.counts.max()) <= 8 for layer in cache.layers)
            else:
                want = kv_bytes_session(std.cfg, n, dtype=torch.float32)
            assert cache.stored_nbytes == want < cache.nbytes
            with torch.no_grad():
                decode(model, cache, model(ids[:, -1:], cache=cache)[:, -1], 20)
        if model is am:
            # budget + one block's slots of capacity, not budget + a prefill chunk's
            assert cache.nbytes < prefill_end
            assert all(layer.capacity == 8 + am.cfg.slots_per_block for layer in cache.layers)


def test_matched_budget_charges_snapkv_for_fed_tokens_and_says_when_it_cannot():
    from anchormass.cache.kv_policies import H2O, SnapKV
    from anchormass.eval.scoring import matched_budget

    assert matched_budget(H2O(), 71.6, fed=62) == (72, None)
    assert matched_budget(SnapKV(window=8), 71.6, fed=62) == (10, None)
    budget, note = matched_budget(SnapKV(window=32), 71.6, fed=62)
    assert budget == 32 and "raised to 32" in note and "window" in note
    budget, note = matched_budget(SnapKV(window=8), 30, fed=62)
    assert budget == 8 and note.startswith("budget raised to 8")
