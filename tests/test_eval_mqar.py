"""The MQAR suite: scoring against an oracle and a constant predictor, parallel = cached on tiny
random-init models, policies cut the stored bytes, input checks, evaluate.py end to end."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra import compose, initialize_config_dir
from scipy import stats

from anchormass.data.mqar import MQARVocab, make_item
from anchormass.errors import ConfigError
from anchormass.eval.report import wilson_interval
from anchormass.eval.runner import run_evaluation
from anchormass.eval.scoring import cached_predictions, parallel_predictions
from anchormass.eval.suite import EvalContext, EvalModel
from anchormass.eval.suites.mqar import MqarSuite, distance_bucket
from anchormass.models import build_model

ROOT = Path(__file__).resolve().parents[1]
VOCAB = MQARVocab(keys=(8, 136), values=(136, 264), noise=(264, 600))
CFG = {"vocab": {"keys": [8, 136], "values": [136, 264], "noise": [264, 600]},
       "lengths": [64, 160], "n_pairs": [2, 8], "n_items": 3, "batch_size": 2}


class Recaller(torch.nn.Module):
    """Stand-in LM whose next-token logits are one-hot: `oracle` recalls the value that followed
    the current token earlier in the sequence (causal: only pairs already seen), else predicts the
    constant `fallback`; with oracle=False it always predicts `fallback`."""

    def __init__(self, vocab_size: int, oracle: bool, fallback: int = 300, keys=VOCAB.keys):
        super().__init__()
        self.keys = keys  # the pairs it can remember: those whose key lies in this range
        self.cfg = SimpleNamespace(vocab_size=vocab_size, arch="standard", name="recaller")
        self.oracle, self.fallback = oracle, fallback
        self.lm_head = torch.nn.Identity()

    def forward_hidden(self, ids):
        out = torch.zeros(*ids.shape, self.cfg.vocab_size)
        for b, row in enumerate(ids.tolist()):
            seen = {}
            for t, tok in enumerate(row):
                if t and self.keys[0] <= row[t - 1] < self.keys[1]:
                    seen[row[t - 1]] = tok
                out[b, t, seen.get(tok, self.fallback) if self.oracle else self.fallback] = 1.0
        return out


def _ctx(*models):
    return EvalContext(models=[m if isinstance(m, EvalModel) else
                               EvalModel(label=m.cfg.name + str(i), model=m, config=m.cfg, source="test")
                               for i, m in enumerate(models)], tokenizer=None, device=torch.device("cpu"),
                       progress=False)


def _run(ctx, **over):
    suite = MqarSuite({**CFG, **over})
    suite.check(ctx)
    return suite, suite.run(ctx)


def test_wilson_interval_known_values():
    assert wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(0, 10)[1] == pytest.approx(1.96 ** 2 / (10 + 1.96 ** 2))
    ref = stats.binomtest(37, 80).proportion_ci(confidence_level=0.95, method="wilson")
    lo, hi = wilson_interval(37, 80, z=stats.norm.ppf(0.975))
    assert (lo, hi) == pytest.approx((ref.low, ref.high), abs=1e-12)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


def test_oracle_scores_everything_a_constant_nothing_and_mcnemar_sees_it():
    ctx = _ctx(Recaller(600, oracle=False), Recaller(600, oracle=True))
    suite, res = _run(ctx)
    a, b = res["labels"]
    assert len(res["cells"]) == 4
    for c in res["cells"]:
        assert c[a]["correct"] == 0 and c[b]["correct"] == c[b]["n"] == 3 * c["n_pairs"]
        assert c["paired"] == {"b": 0, "c": c[b]["n"], "p": pytest.approx(2 * 0.5 ** c[b]["n"])}
        assert c[b]["ci"][0] > 0.4 and c[a]["ci"] == [0.0, pytest.approx(wilson_interval(0, c[a]["n"])[1])]
    assert res["summary"][f"{b}/len160/pairs8/acc"] == 1.0 and res["summary"][f"{a}/len64/pairs2/acc"] == 0.0
    assert len(res["items"]) == 2 * 3 * (2 + 8) * 2  # models x items x queries x lengths
    report = suite.report(res)
    assert "100.0% (24/24)" in report and "0.0% (0/24)" in report and "McNemar p" in report


def test_a_half_right_recaller_scores_half():
    """An oracle that remembers only keys of the lower half of the range answers exactly the
    queries on those keys: the scoring counts per query, not per item."""
    suite = MqarSuite({**CFG, "n_items": 20, "lengths": [160], "n_pairs": [8]})
    ctx = _ctx(Recaller(600, oracle=True, keys=(8, 72)))
    suite.check(ctx)
    expect = sum(it.ids[p] < 72 for it in suite.items(160, 8) for p in it.query_pos)
    res = suite.run(ctx)
    c = res["cells"][0][res["labels"][0]]
    assert 0 < c["correct"] == expect < c["n"]
    # the distance buckets partition the queries and their hits
    buckets = c["by_distance"]
    assert sum(b["n"] for b in buckets.values()) == c["n"] and sum(b["correct"] for b in buckets.values()) == expect
    for r in res["items"]:
        lo = distance_bucket(r["distance"])
        assert str(lo) in buckets and (lo == r["distance"] == 0 or lo <= r["distance"] < 2 * lo)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return {name: build_model(name).eval() for name in ("standard_tiny", "anchormass_tiny")}


@pytest.mark.parametrize("name", ["standard_tiny", "anchormass_tiny"])
def test_parallel_and_cached_predict_the_same_tokens(tiny, name):
    model = tiny[name]
    items = [make_item(VOCAB, 200, 8, 8, 5, i) for i in range(2)]
    ids = torch.tensor([it.ids for it in items])
    par = parallel_predictions(model, ids, items[0].query_pos)
    cac, kv = cached_predictions(model, ids, items[0].context_len, items[0].query_pos, 48)
    assert torch.equal(par, cac)
    assert kv.stored_end > 0
    ctx = _ctx(model)
    p = _run(ctx)[1]["items"]
    c = _run(ctx, mode="cached", chunk=32)[1]["items"]
    assert p == c


def test_policies_shrink_the_stored_bytes(tiny):
    length = 640
    std, am = tiny["standard_tiny"], tiny["anchormass_tiny"]
    over = {"lengths": [length], "n_pairs": [4], "n_items": 2, "mode": "cached", "chunk": 64}
    full = {m.cfg.name: _run(_ctx(m), **over)[1] for m in (std, am)}
    small = {"standard_tiny": _run(_ctx(std), **over, policy="snapkv", budget=128)[1],
             "anchormass_tiny": _run(_ctx(am), **over, budget=2)[1]}
    for name, res in small.items():
        kv_small = res["cells"][0][name + "0"]["stored_bytes"]
        kv_full = full[name]["cells"][0][name + "0"]["stored_bytes"]
        assert 0 < kv_small["stored_prefill"] < kv_full["stored_prefill"]
        assert 0 < kv_small["stored_end"] < kv_full["stored_end"]
    s = MqarSuite({**CFG, **over, "policy": "snapkv", "budget": 128})
    assert "stored KiB" in s.report(small["standard_tiny"]) and "policy: snapkv, budget: 128" in \
        s.report(small["standard_tiny"])


def test_bad_input_is_one_line_in_check():
    small = Recaller(500, oracle=True)
    suite = MqarSuite(CFG)
    with pytest.raises(ConfigError) as err:
        suite.check(_ctx(small))
    msg = str(err.value)
    assert "\n" not in msg and "token ids up to 599 need a vocabulary of at least 600; the model has 500" in msg
    for over, words in [({"n_pairs": [40]}, "need at least"), ({"mode": "fast"}, "parallel or cached"),
                        ({"vocab": {"keys": [0, 10]}}, "needs keys"), ({"vocab": "abc"}, "needs keys"),
                        ({"policy": "snapkv"}, "cached only"),
                        ({"n_queries": 0}, "at least 1"), ({"lengths": "abc"}, "non-empty list of integers"),
                        ({"n_pairs": []}, "non-empty list"), ({"n_items": "x"}, "mqar.n_items must be a number")]:
        with pytest.raises(ConfigError, match=words):
            MqarSuite({**CFG, **over}).check(_ctx(Recaller(600, oracle=True)))
    limited = EvalModel(label="short", model=small, config=SimpleNamespace(vocab_size=600, arch="standard"),
                        source="test", max_context=100)
    with pytest.raises(ConfigError, match="length 160 exceeds"):
        MqarSuite(CFG).check(_ctx(limited))


def test_evaluate_end_to_end_writes_the_section_and_the_plot(tmp_path):
    std = tmp_path / "standard_tiny_small.yaml"
    import yaml

    cfg = yaml.safe_load((ROOT / "configs/model/standard_tiny.yaml").read_text())
    std.write_text(yaml.safe_dump({**cfg, "vocab_size": 600}))
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=[
            "suite=mqar", "eval=cpu_tiny", "model=anchormass_tiny", "model.vocab_size=600", f"compare_model={std}",
            "eval.mqar.lengths=[64,128]", f"out_dir={tmp_path / 'run'}", "progress=false"])
    out = run_evaluation(cfg)
    res = json.loads((out / "results.json").read_text())["suites"]["mqar"]
    assert res["labels"] == ["anchormass_tiny", "standard_tiny"] and len(res["cells"]) == 4
    assert all("paired" in c for c in res["cells"])
    assert (out / "mqar_accuracy.png").stat().st_size > 1000
    assert "## Multi-query associative recall (MQAR)" in (out / "report.md").read_text()


def test_cached_mode_checks_the_policy_for_every_model_up_front(tiny):
    ctx = _ctx(tiny["anchormass_tiny"], tiny["standard_tiny"])
    with pytest.raises(ConfigError, match="mqar: unknown kv policy 'adaptive'.*standard_tiny1"):
        MqarSuite({**CFG, "mode": "cached", "policy": "adaptive", "budget": 4}).check(ctx)
    with pytest.raises(ConfigError, match="budget .* is required"):
        MqarSuite({**CFG, "mode": "cached", "policy": "snapkv"}).check(_ctx(tiny["standard_tiny"]))


def test_out_of_memory_at_a_length_is_a_result(monkeypatch, tmp_path):
    import anchormass.eval.suites.mqar as mqar

    real = mqar.parallel_predictions

    def oom_at_160(model, ids, positions):
        if ids.shape[1] == 160:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2 GiB")
        return real(model, ids, positions)

    monkeypatch.setattr(mqar, "parallel_predictions", oom_at_160)
    suite, res = _run(_ctx(Recaller(600, oracle=False), Recaller(600, oracle=True)))
    a, b = res["labels"]
    for c in res["cells"]:
        oom = c["length"] == 160
        assert (c[a]["status"], c[b]["status"]) == (("OOM", "OOM") if oom else ("ok", "ok"))
        assert (c["paired"] is None) == oom and (c[b]["n"] == 0) == oom
    assert not any("len160" in k for k in res["summary"]) and f"{b}/len64/pairs8/acc" in res["summary"]
    assert "| 160 | 8 | OOM | OOM | - | - |" in suite.report(res)
    assert (tmp_path / suite.plots(res, tmp_path)[0]).stat().st_size > 1000
