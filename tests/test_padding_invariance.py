"""A score is a function of the model and the item, not of the batch it shared (docs/method.md §1).

Right padding cannot reach a real token through causal attention (nor through AnchorMass's block
compression: a block's slots are seen only by queries after it); the dynamic-NTK RoPE base is the
one thing a padded length could change. The parallel forward takes each sequence's length and
uses the base that sequence gets alone, the base a session cache fixes for a prompt of that
length. Checked here on the models, on every suite that batches (JCQA, perplexity, MQAR,
passkey), and on the Hugging Face remote-code class. Lengths run inside and past the trained
length (original_max_len = 64).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from anchormass.cache import new_cache
from anchormass.errors import DataError
from anchormass.inference.generate import prefill
from anchormass.models import build_model, load_model_config
from anchormass.models.rope import ntk_base, positions_for, rope_cos_sin

TRAINED = 64
NAMES = ["standard_tiny", "anchormass_tiny"]
_MODELS: dict = {}


def tiny(name: str, vocab: int = 128, init_std: float = 0.02):
    key = (name, vocab, init_std)
    if key not in _MODELS:
        torch.manual_seed(0)
        cfg = load_model_config(name).replace(vocab_size=vocab, original_max_len=TRAINED, init_std=init_std)
        _MODELS[key] = build_model(cfg).eval()
    return _MODELS[key]


def padded(seqs: list[torch.Tensor], extra: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Right-pad every sequence to max length + extra with random ids (a pad's value must not matter)."""
    t = max(len(s) for s in seqs) + extra
    ids = torch.randint(0, vocab, (len(seqs), t), generator=gen)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
    return ids


# ----------------------------------------------------------------------------- the models
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", [0, 1, 2])
@torch.no_grad()
def test_padding_never_changes_a_real_tokens_logits(name, seed):
    m = tiny(name)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    # lengths inside and past the trained length, not on block boundaries, and one exactly at it
    lengths = [rng.randint(1, TRAINED), TRAINED, rng.randint(TRAINED + 1, 150), rng.randint(150, 260)]
    rng.shuffle(lengths)
    seqs = [torch.randint(0, 128, (n,), generator=gen) for n in lengths]
    ids = padded(seqs, rng.randint(0, 100), 128, gen)
    batch = m(ids, lengths=lengths)
    for i, s in enumerate(seqs):
        alone = m(s[None])[0]
        assert (batch[i, :len(s)] - alone).abs().max().item() <= 1e-5, f"length {len(s)} in a batch of {ids.shape[1]}"
    # Without lengths the padded length sets the base: the rows past the trained length move.
    blind = m(ids)
    worst = max((blind[i, :len(s)] - m(s[None])[0]).abs().max().item() for i, s in enumerate(seqs))
    assert worst > 1e-3


@pytest.mark.parametrize("name", NAMES)
@torch.no_grad()
def test_a_padded_row_equals_the_session_that_prefills_it(name):
    """The base the cache fixes at prefill for a prompt of P tokens is the base the parallel path
    gives a padded row of P tokens: the prompt's last logits agree, so do the cos/sin tables."""
    from anchormass.models.rope import sequence_cos_sin

    m = tiny(name)
    gen = torch.Generator().manual_seed(5)
    lengths = [40, 150, 97]
    seqs = [torch.randint(0, 128, (n,), generator=gen) for n in lengths]
    batch = m(padded(seqs, 30, 128, gen), lengths=lengths)
    for i, s in enumerate(seqs):
        cache = new_cache(m, batch_size=1, budget=4096 if m.cfg.arch == "anchormass" else None)
        last = prefill(m, s[None], cache, chunk_size=32)
        base = ntk_base(m.cfg.rope_theta, len(s), TRAINED, m.cfg.head_dim)
        assert cache.rope_base == base
        assert (last[0] - batch[i, len(s) - 1]).abs().max().item() <= 1e-4
        cos, sin = sequence_cos_sin([len(s)], len(s), m.cfg.rope_theta, TRAINED, m.cfg.head_dim, "cpu")
        want = rope_cos_sin(positions_for(0, len(s), "cpu"), cache.rope_base, m.cfg.head_dim)
        assert torch.equal(cos, want[0]) and torch.equal(sin, want[1])


@torch.no_grad()
def test_one_base_keeps_the_unpadded_path():
    """Equal lengths, or all within the trained length: one [T, D] table, the same numbers as no lengths."""
    m = tiny("anchormass_tiny")
    ids = torch.randint(0, 128, (3, 120), generator=torch.Generator().manual_seed(0))
    assert torch.equal(m(ids, lengths=[120] * 3), m(ids))
    cos, _ = m.rope(120, torch.device("cpu"), lengths=[10, 64, 33])
    assert cos.shape == (120, m.cfg.head_dim)
    cos, _ = m.rope(120, torch.device("cpu"), lengths=[10, 120, 100])
    assert cos.shape == (3, 1, 120, m.cfg.head_dim)
    plain = rope_cos_sin(positions_for(0, 120, "cpu"), m.cfg.rope_theta, m.cfg.head_dim)[0]
    assert torch.equal(cos[0, 0], plain) and not torch.equal(cos[1, 0], plain) and not torch.equal(cos[1, 0], cos[2, 0])


def test_bad_lengths_are_one_line_errors():
    m = tiny("standard_tiny")
    ids = torch.zeros(2, 10, dtype=torch.long)
    for bad in ([10], [0, 5], [5, 11], [2.5, 3]):
        with pytest.raises(DataError, match="lengths must be 2 integers in \\[1, 10\\]"):
            m(ids, lengths=bad)
    with pytest.raises(DataError, match="cache-free forward only"):
        m(ids, cache=new_cache(m, batch_size=2), lengths=[10, 10])


# ----------------------------------------------------------------------------- the suites
def _same_scores(runs: dict[str, dict], tol: float = 1e-5) -> None:
    """Every run gives every item the same score (within fp32 summation order) and the same decision."""
    (first_name, first), *rest = runs.items()
    for name, run in rest:
        assert run.keys() == first.keys()
        for key, (score, decision) in first.items():
            other_score, other_decision = run[key]
            assert np.allclose(other_score, score, rtol=1e-6, atol=tol), f"{name} vs {first_name}: item {key}"
            assert other_decision == decision, f"{name} vs {first_name}: item {key}"


class CharTokenizer:
    """One id per character (ids 4 .. 63): prompt lengths in tokens are their lengths in characters."""

    pad_id, bos_id, unk_id, vocab_size = 0, 2, 1, 64

    def encode(self, text):
        return [4 + (ord(c) % 60) for c in text]


def _questions(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    words = ["りんご", "みかん", "ぶどう", "もも", "なし", "すいか", "いちご", "かき"]
    return [{"q_id": i, "question": "これは" + "とても" * rng.randint(0, 12) + "何？",
             "choices": rng.sample(words, 5), "label": rng.randrange(5)} for i in range(n)]


@pytest.mark.parametrize("name", NAMES)
def test_jcqa_scores_do_not_depend_on_batch_size_or_order(name):
    from anchormass.eval.suites.jcqa import score_questions
    from anchormass.eval.suites.jcqa.questions import resolve_template, shots_per_question

    m = tiny(name, vocab=64, init_std=0.2)
    tok = CharTokenizer()
    questions, template = _questions(10, 0), resolve_template("lm_eval_harness")
    shots = shots_per_question(_questions(20, 1), len(questions), 2, 1234, "per_question")
    # prompts of ~150-250 tokens: every one past the trained length, each batch padded differently
    runs = {}
    with torch.no_grad():
        for bq in (1, 3, 8):
            res = score_questions(m, tok, questions, shots, template, device="cpu", batch_questions=bq)
            runs[f"batch {bq}"] = {r["q_id"]: (r["loglik"], (r["pred"], r["pred_norm"])) for r in res}
        order = list(range(len(questions)))
        random.Random(3).shuffle(order)
        res = score_questions(m, tok, [questions[i] for i in order], [shots[i] for i in order], template,
                              device="cpu", batch_questions=3)
        runs["shuffled"] = {r["q_id"]: (r["loglik"], (r["pred"], r["pred_norm"])) for r in res}
    _same_scores(runs)


def _eval_ctx(model, tmp_path=None, tokenizer=None):
    from anchormass.eval.suite import EvalContext, EvalModel

    em = EvalModel(label="m", model=model, config=model.cfg, source="test")
    return EvalContext(models=[em], tokenizer=tokenizer, device=torch.device("cpu"), progress=False,
                       data_dir=tmp_path, record_data=lambda *a: None)


@pytest.mark.parametrize("name", NAMES)
def test_perplexity_per_anchor_does_not_depend_on_batch_size_or_order(name, tmp_path):
    from anchormass.data.token_file import write_tokens
    from anchormass.eval.suites.ppl import PplSuite

    m = tiny(name, vocab=64)
    write_tokens(tmp_path / "val.bin", np.random.default_rng(0).integers(0, 64, size=3000), 64)
    ctx = _eval_ctx(m, tmp_path)
    base = {"contexts": [0, 100], "target_len": 48}  # 48 and 148 tokens: inside and past the trained length
    suite = PplSuite({**base, "n_anchors": 8})
    suite.check(ctx)
    anchors = suite.anchors
    shuffled = anchors[:]
    random.Random(0).shuffle(shuffled)
    runs = {}
    with torch.no_grad():
        for label, bs, order in (("batch 1", 1, anchors), ("batch 3", 3, anchors), ("batch 8", 8, anchors),
                                 ("shuffled", 3, shuffled)):
            s = PplSuite({**base, "anchors": order, "batch_size": bs})
            s.check(ctx)
            runs[label] = {(r["context"], r["anchor"]): (r["nll"], None) for r in s.run(ctx)["items"]}
    _same_scores(runs)


@pytest.mark.parametrize("name", NAMES)
def test_mqar_per_query_does_not_depend_on_batch_size_or_order(name):
    from anchormass.data.mqar import MQARVocab, make_item
    from anchormass.eval.scoring import parallel_predictions
    from anchormass.eval.suites.mqar import MqarSuite

    m = tiny(name, vocab=600)
    ctx = _eval_ctx(m)
    cfg = {"vocab": {"keys": [8, 136], "values": [136, 264], "noise": [264, 600]}, "lengths": [48, 160],
           "n_pairs": [4], "n_items": 8}
    runs = {}
    with torch.no_grad():
        for bs in (1, 3, 8):
            suite = MqarSuite({**cfg, "batch_size": bs})
            suite.check(ctx)
            runs[f"batch {bs}"] = {(r["length"], r["item"], r["query"]): (0.0, r["correct"])
                                   for r in suite.run(ctx)["items"]}
        vocab = MQARVocab(keys=(8, 136), values=(136, 264), noise=(264, 600))
        items = [make_item(vocab, 160, 4, 4, 0, i) for i in range(8)]
        ids = torch.tensor([it.ids for it in items])
        order = torch.randperm(8, generator=torch.Generator().manual_seed(0))
        straight = parallel_predictions(m, ids, items[0].query_pos)
        assert torch.equal(parallel_predictions(m, ids[order], items[0].query_pos), straight[order])
    _same_scores(runs)


class DigitTokenizer(CharTokenizer):
    """Characters -> ids 10 .. 109 and back, so decoded text and digit answers round-trip."""

    vocab_size = 110

    def encode(self, text):
        return [10 + (ord(c) % 100) for c in text]

    def decode(self, ids):
        return "".join(chr(48 + (i - 10) % 100) if i >= 10 else "" for i in ids)


@pytest.mark.parametrize("name", NAMES)
def test_passkey_outputs_do_not_depend_on_batch_size_or_order(name):
    from anchormass.eval.items import Haystack, run_trials, trial_grid

    m = tiny(name, vocab=110, init_std=0.2)
    tok = DigitTokenizer()
    ctx = _eval_ctx(m, tokenizer=tok)
    hay = Haystack(tok, filler="classic_en", lang="en")
    trials = trial_grid([100, 200], [0.2, 0.8], [0, 1])  # 8 trials, inside and past the trained length
    shuffled = trials[:]
    random.Random(1).shuffle(shuffled)
    runs = {}
    for label, bs, order in (("batch 1", 1, trials), ("batch 3", 3, trials), ("batch 8", 8, trials),
                             ("shuffled", 3, shuffled)):
        recs = run_trials(ctx, ctx.models[0], hay, order, max_new_tokens=4, batch_size=bs, chunk=64)
        runs[label] = {(r["length"], r["depth"], r["seed"]): (0.0, r["output"]) for r in recs}
    _same_scores(runs)


# ----------------------------------------------------------------------------- Hugging Face
@torch.no_grad()
def test_hf_remote_code_scores_right_padded_batches_and_refuses_the_rest():
    pytest.importorskip("transformers")
    from anchormass.hf.export_anchormass import hf_wrapper

    m = tiny("anchormass_tiny")
    hf = hf_wrapper(m, {"pad": 0, "bos": 2, "eos": 3})
    gen = torch.Generator().manual_seed(2)
    lengths = [30, 140, 90]
    seqs = [torch.randint(4, 128, (n,), generator=gen) for n in lengths]
    ids = padded(seqs, 0, 128, gen)
    mask = (torch.arange(ids.shape[1])[None] < torch.tensor(lengths)[:, None]).long()
    logits = hf(input_ids=ids, attention_mask=mask).logits
    for i, s in enumerate(seqs):
        assert (logits[i, :len(s)] - m(s[None])[0]).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="right-padded"):
        hf(input_ids=ids, attention_mask=mask.flip(1))  # left padding
    with pytest.raises(ValueError, match="padded batches are not supported with a cache"):
        hf.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False)
