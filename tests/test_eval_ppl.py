import numpy as np
import pytest
import torch

from anchormass.data.token_file import write_tokens
from anchormass.errors import DataError
from anchormass.eval.items import draw_anchors
from anchormass.eval.scoring import target_logprobs
from anchormass.eval.suite import EvalContext, EvalModel
from anchormass.eval.suites.ppl import PplSuite, cached_target_logprobs
from anchormass.models import build_model
from anchormass.models.config import load_model_config


def test_anchors_are_deterministic_spread_and_in_range():
    a = draw_anchors(100_000, 31_744, 1024, 10, seed=0)
    assert a == draw_anchors(100_000, 31_744, 1024, 10, seed=0)
    assert a != draw_anchors(100_000, 31_744, 1024, 10, seed=1)
    assert len(set(a)) == 10 and a == sorted(a)
    assert min(a) >= 31_744 and max(a) + 1024 <= 100_000
    with pytest.raises(DataError, match="anchors need"):
        draw_anchors(5_000, 4_000, 1024, 10, seed=0)


class Bigram(torch.nn.Module):
    """Logits depend on the current token only: a scored (prev, target) pair has the same NLL
    whatever context precedes it, so equal NLL at every C means the same targets were scored."""

    def __init__(self, vocab=50):
        super().__init__()
        torch.manual_seed(0)
        self.table = torch.nn.Embedding(vocab, vocab)

    def forward(self, ids):
        return self.table(ids)


def _ctx(models, tmp_path, n=3000, vocab=50):
    rng = np.random.default_rng(0)
    write_tokens(tmp_path / "val.bin", rng.integers(0, vocab, size=n), vocab)
    return EvalContext(models=models, tokenizer=None, device=torch.device("cpu"), progress=False,
                       data_dir=tmp_path, record_data=lambda *a: None)


def test_same_targets_scored_at_every_context_length(tmp_path):
    cfg = load_model_config("standard_tiny").replace(vocab_size=50)
    m = EvalModel("bigram", Bigram(), cfg, "test")
    ctx = _ctx([m], tmp_path)
    suite = PplSuite({"contexts": [0, 100, 500], "target_len": 64, "n_anchors": 5, "batch_size": 2})
    suite.check(ctx)
    res = suite.run(ctx)
    assert res["targets_per_anchor"] == 63
    by_c = {c: [r["nll"] for r in res["items"] if r["context"] == c] for c in (0, 100, 500)}
    assert by_c[0] == pytest.approx(by_c[100], abs=1e-6) and by_c[0] == pytest.approx(by_c[500], abs=1e-6)
    # and they are the bigram NLLs of tok[a+1 .. a+63] given tok[a .. a+62]
    tok = suite.tokens
    a = res["anchors"][0]
    ids = torch.as_tensor(np.asarray(tok[a:a + 64], dtype=np.int64))
    lp = torch.log_softmax(Bigram().table(ids[:-1]), -1).gather(-1, ids[1:, None])
    assert by_c[0][0] == pytest.approx(-lp.mean().item(), rel=1e-5)


def test_cached_mode_matches_parallel_before_stage_two():
    torch.manual_seed(0)
    model = build_model(load_model_config("anchormass_tiny").replace(vocab_size=64)).eval()
    ids = torch.randint(0, 64, (2, 300))
    with torch.no_grad():
        par = target_logprobs(model, ids, 100)
        cac = cached_target_logprobs(model, ids, 100, chunk=96)
    assert par.shape == cac.shape == (2, 199)
    assert (par - cac).abs().max().item() < 1e-4


class OomAbove(Bigram):
    """Runs out of memory on inputs longer than `limit` tokens."""

    def __init__(self, limit):
        super().__init__()
        self.limit = limit

    def forward(self, ids):
        if ids.shape[1] > self.limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().forward(ids)


def test_oom_at_a_length_is_a_recorded_result(tmp_path):
    cfg = load_model_config("standard_tiny").replace(vocab_size=50)
    m = EvalModel("oomy", OomAbove(200), cfg, "test")
    ctx = _ctx([m], tmp_path)
    suite = PplSuite({"contexts": [0, 300], "target_len": 64, "n_anchors": 3})
    suite.check(ctx)
    res = suite.run(ctx)
    rows = {r["context"]: r for r in res["rows"]}
    assert rows[0]["oomy"]["ppl"] > 1 and rows[300]["oomy"] == "OOM"
    assert "OOM" in suite.report(res)


def test_holm_counts_only_the_lengths_both_models_finished(tmp_path):
    cfg = load_model_config("standard_tiny").replace(vocab_size=50)
    models = [EvalModel("ok", Bigram(), cfg, "test"),
              EvalModel("oomy", OomAbove(200), cfg, "test")]
    ctx = _ctx(models, tmp_path)
    suite = PplSuite({"contexts": [0, 100, 300], "target_len": 64, "n_anchors": 6})
    suite.check(ctx)
    res = suite.run(ctx)
    assert res["holm"] == {"m": 2, "contexts": [0, 100], "excluded_oom": [300]}
    rows = {r["context"]: r for r in res["rows"]}
    assert rows[0]["test"]["holm_m"] == 2 and "test" not in rows[300]
    assert "m = 2 lengths" in suite.report(res)


def test_cached_mode_applies_snapkv_at_the_end_of_the_context():
    """SnapKV compresses when the prefill ends; cached scoring must end it at the context, or
    the policy silently scores the full cache."""
    from anchormass.cache.kv_policies import SnapKV

    torch.manual_seed(0)
    model = build_model(load_model_config("standard_tiny").replace(vocab_size=64)).eval()
    ids = torch.randint(0, 64, (2, 200))
    with torch.no_grad():
        full = cached_target_logprobs(model, ids, 150, chunk=64)
        snap = cached_target_logprobs(model, ids, 150, chunk=64, policy=SnapKV(window=8), budget=32)
        roomy = cached_target_logprobs(model, ids, 150, chunk=64, policy=SnapKV(window=8), budget=400)
    assert full.shape == snap.shape == (2, 49)
    assert (full - snap).abs().max().item() > 1e-3  # the compressed context changes the scores
    torch.testing.assert_close(roomy, full, atol=1e-5, rtol=0)  # a budget that keeps everything changes nothing
