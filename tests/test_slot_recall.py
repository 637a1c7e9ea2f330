"""The slot-recall ladder (docs/method.md §6 i): the task generator, its prepared data, and the
probes that read what stage 1 kept of a needle, on tiny models."""

import pytest
import torch

from anchormass.data.datamodule import SFTDataModule
from anchormass.data.prepare import prepare
from anchormass.data.slot_recall import (
    TASKS,
    SlotRecallVocab,
    TaskSpec,
    assert_disjoint,
    make_item,
    recall_free_rate,
    task_specs,
    training_examples,
)
from anchormass.errors import ConfigError
from anchormass.eval.slot_probe import LayerView, probe_forward
from anchormass.eval.suites.slot_recall import score_batch
from anchormass.models import build_model, load_model_config
from anchormass.models.reference import reference_anchormass_attention

VOCAB = SlotRecallVocab()


def _in(ids, rng):
    return all(rng[0] <= i < rng[1] for i in ids)


@pytest.mark.parametrize("task", TASKS)
def test_recall_free_rate_is_the_hit_rate_of_guessing_among_the_answer_ids_in_context(task):
    """The reference is checked against a simulated guesser: it draws each answer token uniformly from
    the distinct answer-type ids before the question, and its hit rate must match the formula."""
    import numpy as np

    spec = TaskSpec(task, 513)
    lo, hi = VOCAB.digits if task == "passkey" else VOCAB.values
    rng = np.random.default_rng(0)
    for i in range(6):
        it = make_item(VOCAB, spec, "eval", 0, i)
        for q in it.questions:
            pool = sorted({t for t in it.ids[:min(q.predict) + 1] if lo <= t < hi})
            answer = [it.ids[t + 1] for t in q.predict]
            assert set(answer) <= set(pool)  # the answers are among the ids guessed from
            hits = np.mean([[int(x) for x in rng.choice(pool, size=len(answer))] == answer for _ in range(4000)])
            rate = recall_free_rate(VOCAB, it, q)
            assert rate == pytest.approx(len(pool) ** -len(answer))
            assert abs(hits - rate) < 4 * np.sqrt(rate * (1 - rate) / 4000) + 1e-9


@pytest.mark.parametrize("task", TASKS)
def test_answers_lie_beyond_the_window_after_the_sinks_in_their_own_ranges(task):
    spec = TaskSpec(task, 513)
    for i in range(40):
        it = make_item(VOCAB, spec, "train", 0, i)
        assert len(it.ids) == 513 and it.questions
        for q in it.questions:
            assert q.distance >= 64 and min(q.predict) - (q.fact[1] - 1) >= 64
            assert q.fact[0] >= 16
            answers = [it.ids[t + 1] for t in q.predict]
            assert _in(answers, VOCAB.digits if task == "passkey" else VOCAB.values)
            for copies, a in zip(q.answer_pos, answers):  # every recorded copy holds the answer token
                assert all(it.ids[p] == a for p in copies)
            if task != "passkey":
                assert _in([it.ids[min(q.predict)]], VOCAB.keys)
        mask = it.loss_mask()
        assert mask.sum() == sum(len(q.predict) for q in it.questions)
        facts = {p for q in it.questions for p in range(*q.fact)}
        ctx = TaskSpec(task, 513).context_len
        noise = [x for p, x in enumerate(it.ids[:ctx]) if p not in facts]
        assert _in(noise, VOCAB.noise)


def test_span_says_key_and_value_span_times_and_passkey_says_the_key_twice():
    it = make_item(VOCAB, TaskSpec("span", 513, span=16), "eval", 0, 3)
    for q in it.questions:
        lo, hi = q.fact
        assert hi - lo == 32 and len(set(it.ids[lo:lo + 16])) == 1 and len(set(it.ids[lo + 16:hi])) == 1
    pk = make_item(VOCAB, TaskSpec("passkey", 513), "eval", 0, 3)
    (q,) = pk.questions
    assert all(len(c) == 2 for c in q.answer_pos) and 1000 <= int("".join(str(pk.ids[t + 1] - 24) for t in q.predict))


def test_held_out_items_are_never_training_items_and_streams_differ():
    for task in TASKS:
        spec = TaskSpec(task, 513)
        train = [make_item(VOCAB, spec, "train", 0, i) for i in range(200)]
        held = [make_item(VOCAB, spec, "eval", 0, i) for i in range(50)]
        assert_disjoint(train, held)
        assert make_item(VOCAB, spec, "eval", 0, 7).ids == held[7].ids  # a pure function of its arguments
    with pytest.raises(ConfigError, match="also occur in the training items"):
        assert_disjoint(train, train[:3])


def test_bad_vocab_and_shapes_are_one_line_config_errors():
    with pytest.raises(ConfigError, match="vocab.keys .* and vocab.values .* overlap"):
        SlotRecallVocab(keys=(64, 140), values=(128, 192))
    with pytest.raises(ConfigError, match="exactly 10"):
        SlotRecallVocab(digits=(24, 30))
    with pytest.raises(ConfigError, match="no room"):
        TaskSpec("span", 100, n_pairs=4, span=16)
    with pytest.raises(ConfigError, match="need a vocabulary of at least 512"):
        VOCAB.check_fits(400)


def test_prepared_folder_trains_on_the_answers_only(tmp_path):
    cfg = {"name": "sr", "kind": "slot_recall", "out_dir": str(tmp_path / "sr"), "tokenizer": {"vocab_size": 512},
           "slot_recall": {"length": 129, "n_train": 12, "n_val": 4, "min_distance": 64, "start": 16,
                           "tasks": {"kv": {"n_pairs": 2}, "passkey": {}}}}
    out, meta = prepare(cfg)
    assert meta["vocab_size"] == 512 and meta["kind"] == "sft"
    dm = SFTDataModule(data_dir=out, seq_len=128, global_batch_size=4, seed=0, num_workers=0)
    dm.setup("fit")
    tgt = next(iter(dm.train_dataloader()))["targets"]
    per_row = (tgt != -100).sum(1).tolist()
    assert set(per_row) <= {2, 4} and all(per_row)  # kv: its 2 values; passkey: the 4 digits
    answers = tgt[tgt != -100]
    assert ((answers >= VOCAB.digits[0]) & (answers < VOCAB.values[1]) & ~((answers >= VOCAB.digits[1])
                                                                          & (answers < VOCAB.values[0]))).all()
    ex = list(training_examples(VOCAB, task_specs(cfg["slot_recall"], 129), "train", 12, 0))
    assert meta["splits"]["train"]["loss_tokens"] == sum(sum(m) for _, m in ex)


def test_prepared_folder_can_reuse_another_datasets_tokenizer(tmp_path):
    """tokenizer.path: the ladder's folder carries that tokenizer (same checksum), so a checkpoint trained
    on the other dataset may continue here (train.py refuses a tokenizer mismatch); ids must still fit."""
    cfg = {"name": "a", "kind": "slot_recall", "out_dir": str(tmp_path / "a"), "tokenizer": {"vocab_size": 600},
           "slot_recall": {"length": 129, "n_train": 2, "n_val": 1, "tasks": {"kv": {"n_pairs": 2}}}}
    first, meta_a = prepare(cfg)
    cfg_b = {**cfg, "name": "b", "out_dir": str(tmp_path / "b"), "tokenizer": {"path": str(first / "tokenizer.model")}}
    second, meta_b = prepare(cfg_b)
    assert (second / "tokenizer.model").read_bytes() == (first / "tokenizer.model").read_bytes()
    assert meta_b["tokenizer_checksum"] == meta_a["tokenizer_checksum"] and meta_b["vocab_size"] == 600
    import random

    from anchormass.data.tokenizer import train_tokenizer

    r = random.Random(0)  # a small ASCII corpus: a 400-piece tokenizer trains on it in a moment
    words = ["".join(r.choice("abcdefghij") for _ in range(r.randint(2, 6))) for _ in range(300)]
    small = train_tokenizer([" ".join(r.choice(words) for _ in range(200)) for _ in range(20)],
                            tmp_path / "small.model", 400, model_type="bpe", character_coverage=1.0)
    assert small.vocab_size == 400  # a reused tokenizer too small for the ladder's ids is refused
    too_small = {**cfg, "name": "c", "out_dir": str(tmp_path / "c"),
                 "tokenizer": {"path": str(tmp_path / "small.model")}}
    with pytest.raises(ConfigError, match="need a vocabulary of at least 512"):
        prepare(too_small)


def _model(arch="anchormass", **changes):
    cfg = load_model_config("anchormass_tiny").replace(arch=arch, vocab_size=512, n_layers=1, **changes)
    torch.manual_seed(0)
    return build_model(cfg).eval()


def _plant_outlier_values(model):
    """Layer 0's values read embedding dim 0 only: +1 for every token but the value range's, -1 for
    those. In a group of noise/keys with one value, the value is the one off-direction token (cos
    -1 against a mean of +3/4): the outlier by construction; a group of value copies emits nothing."""
    with torch.no_grad():
        model.embed.weight[:, 0] = 5.0
        model.embed.weight[VOCAB.values[0]:VOCAB.values[1], 0] = -5.0
        v = model.blocks[0].attn.v_proj.weight
        v.zero_()
        v[:, 0] = 1.0


def test_a_value_planted_as_outlier_is_reported_as_outlier_and_copies_as_anchor_or_averaged():
    model = _model()
    _plant_outlier_values(model)
    kv = [make_item(VOCAB, TaskSpec("kv", 513), "eval", 0, i) for i in range(3)]
    recs = score_batch(model, kv, "parallel")
    for r in recs:
        (layer,) = r["layers"]
        assert layer["status"] == {"outlier": 1} and layer["all_kept"]
        assert 0 < layer["emit"] < 0.2  # only the groups holding a value emit
    span = [make_item(VOCAB, TaskSpec("span", 513, span=16), "eval", 0, i) for i in range(3)]
    for r in score_batch(model, span, "parallel"):
        st = r["layers"][0]["status"]
        assert st.get("averaged", 0) >= 12 and st.get("anchor", 0) >= 1 and r["layers"][0]["all_kept"]
    # the same items on the lossless control: every copy its own exact slot, nothing emitted
    g1 = _model(group_size=1)
    _plant_outlier_values(g1)
    for r in score_batch(g1, kv, "parallel"):
        assert r["layers"][0]["status"] == {"exact": 1} and r["layers"][0]["emit"] == 0.0


@pytest.mark.parametrize("arch", ["anchormass", "standard"])
def test_attention_weights_are_the_models_attention(arch):
    """softmax weights x visible values at a query equal the model's own attention output there
    (the dense reference for AnchorMass's global heads), and sum to one over everything visible."""
    model = _model(arch)
    ids = torch.randint(0, 512, (2, 300))
    _, qkv = probe_forward(model, ids, [299])
    view = LayerView(model.cfg, qkv[0])
    cfg = model.cfg
    if arch == "anchormass":
        ref = reference_anchormass_attention(qkv[0].q, qkv[0].k, qkv[0].v, cfg)[:, cfg.n_local_heads:]
    else:
        w = torch.softmax((qkv[0].q @ qkv[0].k.transpose(-1, -2)) / cfg.head_dim ** 0.5
                          + torch.full((300, 300), float("-inf")).triu(1), dim=-1)
        ref = w @ qkv[0].v
    for b, t in [(0, 299), (1, 150), (0, 40), (1, 10)]:
        w, vals, _ = view.attention(b, t)
        out = (w[:, :, None] * vals.double()).sum(1)
        assert torch.allclose(out.float(), ref[b, :, t], atol=1e-5)
        assert view.attention_on(b, t, 0, t + 1) == pytest.approx(1.0)


def test_attention_on_the_needle_follows_the_keys_that_hold_it():
    """A query that sees only sinks, slots and its tail puts its mass on a fact's slots exactly when
    that fact's group has it: with every key equal, a slot's share is its mass over the total."""
    model = _model()
    with torch.no_grad():
        model.blocks[0].attn.k_proj.weight.zero_()  # all logits 0: weights = mass / total mass
    ids = torch.randint(200, 512, (1, 200))
    _, qkv = probe_forward(model, ids, [199])
    view = LayerView(model.cfg, qkv[0])
    # t = 199: block 2 (positions 144..207) is its own; blocks 0, 1 (16..143) are slots; 16 sinks
    assert view.attention_on(0, 199, 16, 24) == pytest.approx(8 / 200)  # one group: its 8 tokens of 200
    assert view.attention_on(0, 199, 0, 16) == pytest.approx(16 / 200)


def test_emit_rate_is_the_fraction_of_groups_that_emit():
    model = _model()
    _plant_outlier_values(model)
    it = make_item(VOCAB, TaskSpec("kv", 513, n_pairs=4), "eval", 0, 0)
    _, qkv = probe_forward(model, torch.tensor([it.ids[:-1]]), [500])
    view = LayerView(model.cfg, qkv[0])
    value_groups = {(p - 16) // 8 for q in it.questions for c in q.answer_pos for p in c}
    assert view.emit_rate(0) == pytest.approx(len(value_groups) / view.emit.shape[1])


def _suite_result(tmp_path, name, **cfg):
    from anchormass.eval.runner import run_evaluation

    out = run_evaluation({"suite": "slot_recall", "model": "anchormass_tiny", "compare_model": "standard_tiny",
                          "out_dir": str(tmp_path / name), "progress": False,
                          "eval": {"slot_recall": {"n_items": 2, "batch_size": 2, "lengths": [257],
                                                   "tasks": {"kv": {"n_pairs": 2}, "passkey": {}}, **cfg}}})
    import json
    return json.loads((out / "results.json").read_text())["suites"]["slot_recall"]


def test_suite_through_the_cache_and_pooled_over_seeds_with_a_model_missing_in_one(tmp_path):
    """mode=cached runs every model through its cache under a policy and budget (the probes still read
    the parallel forward); a model scored under only some seeds is pooled over those and says so."""
    from anchormass.eval.suites.slot_recall_pool import pool_seeds

    cached = _suite_result(tmp_path, "c", mode="cached", policy="fifo", budget=16, kv_policy="streaming_llm",
                           kv_budget=32, labels=["am", "std"])
    assert cached["mode"] == "cached" and cached["policy"] == "fifo" and len(cached["items"]) == 2 * (2 * 2 + 2)
    assert all("layers" in r for r in cached["items"])
    other = _suite_result(tmp_path, "p", labels=["am", "extra"])
    pooled = pool_seeds([cached, other], [0, 1])
    assert pooled["json"]["labels"] == ["am", "std", "extra"]
    kv = pooled["json"]["cells"][0]
    assert kv["am"]["n"] == 2 * 2 * 2 and kv["am"]["n_seeds"] == 2  # 2 seeds x 2 items x 2 questions (kv)
    assert kv["std"]["n"] == 2 * 2 and kv["std"]["n_seeds"] == 1 and "(1 seed)" in pooled["markdown"]
    assert kv["extra"]["paired"]["b"] + kv["extra"]["paired"]["c"] <= 2 * 2  # paired on seed 1's questions only
    with pytest.raises(ConfigError, match="first model"):
        pool_seeds([{**other, "labels": ["extra", "am"]}, cached], [0, 1])
    both = pool_seeds([cached, cached], [0, 1])  # AnchorMass against the Standard twin of its shape, paired
    vs = both["json"]["cells"][0]["am"]["vs_controls"]
    by = {lab: [r["correct"] for r in cached["items"] if r["model"] == lab and r["task"] == "kv"]
          for lab in ("am", "std")}
    b = sum(x and not y for x, y in zip(by["am"], by["std"]))
    c = sum(y and not x for x, y in zip(by["am"], by["std"]))
    assert list(vs) == ["std"] and (vs["std"]["b"], vs["std"]["c"]) == (2 * b, 2 * c)
    assert both["json"]["cells"][0]["std"]["vs_controls"] == {}  # only AnchorMass models are compared to controls


def test_the_study_scores_the_layout_it_trains_on():
    """configs/eval/slot_recall.yaml asks the held-out questions in configs/data/slot_recall.yaml's
    layout (vocabulary, tasks, distances, length): a drift would score tasks the models never saw."""
    from omegaconf import OmegaConf

    from anchormass.utils import CONFIG_ROOT

    data = OmegaConf.to_container(OmegaConf.load(CONFIG_ROOT / "data" / "slot_recall.yaml"))["slot_recall"]
    ev = OmegaConf.to_container(OmegaConf.load(CONFIG_ROOT / "eval" / "slot_recall.yaml"))["slot_recall"]
    assert ev["vocab"] == data["vocab"] and ev["lengths"] == [data["length"]]
    assert {k: ev[k] for k in ("min_distance", "start")} == {k: data[k] for k in ("min_distance", "start")}
    strip = lambda tasks: {t: {k: v for k, v in (o or {}).items() if k != "fraction"} for t, o in tasks.items()}  # noqa: E731
    assert strip(ev["tasks"]) == strip(data["tasks"])
