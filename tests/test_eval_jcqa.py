import json
from pathlib import Path

import pytest
import torch

from anchormass.errors import ConfigError, DataError
from anchormass.eval.suites.jcqa import choice_logliks, score_questions
from anchormass.eval.suites.jcqa.questions import (
    TEMPLATE,
    build_prompt,
    continuations,
    load_split,
    pick_shots,
    read_jsonl,
    resolve_template,
    shots_per_question,
)


class CharTokenizer:
    pad_id, bos_id = 0, 2

    def encode(self, text):
        return [4 + (ord(c) % 60) for c in text]


class RiggedModel(torch.nn.Module):
    """Logits favour one token id everywhere, so the choice made of that token wins."""

    def __init__(self, favourite: int, vocab: int = 64):
        super().__init__()
        self.favourite, self.vocab = favourite, vocab

    def forward(self, ids):
        logits = torch.zeros(*ids.shape, self.vocab)
        logits[..., self.favourite] = 5.0
        return logits


def _q(qid, choices, label):
    return {"q_id": qid, "question": "どれ？", "choices": choices, "label": label}


def test_rigged_model_picks_the_right_choice_and_norm_uses_char_length():
    tok = CharTokenizer()
    fav = tok.encode("x")[0]
    qs = [_q(1, ["ab", "x", "cd", "ef", "gh"], 1), _q(2, ["xxx", "ab", "x", "q", "r"], 2)]
    res = score_questions(RiggedModel(fav), tok, qs, [[], []], TEMPLATE, device="cpu", batch_questions=2)
    assert res[0]["pred"] == 1 and res[0]["correct"]
    # Summed log-lik prefers the shortest likely choice "x" over "xxx"; per-char they are equal-ish
    assert res[1]["pred"] == 2 and res[1]["correct"]
    assert len(res[1]["loglik"]) == 5
    # the rigged model's log-prob of "x" is the same at every position: "xxx" sums 3 of them
    assert res[1]["loglik"][0] == pytest.approx(3 * res[1]["loglik"][2], rel=1e-5)


def test_choice_logliks_match_a_direct_computation_and_ignore_padding():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64))  # position-wise toy LM
    seqs = [([5, 6, 7], [8, 9]), ([5], [10, 11, 12, 13])]
    got = choice_logliks(model, seqs, pad_id=0, device="cpu")
    for (c, x), val in zip(seqs, got):
        ids = torch.tensor([c + x])
        lp = torch.log_softmax(model(ids)[0], -1)
        want = sum(lp[len(c) - 1 + j, x[j]].item() for j in range(len(x)))
        assert val == pytest.approx(want, rel=1e-5)


def test_prompt_shots_and_local_loading(tmp_path):
    rows = [{"q_id": i, "question": f"問{i}", **{f"choice{k}": f"c{i}{k}" for k in range(5)}, "label": i % 5}
            for i in range(20)]
    (tmp_path / "train-v1.3.json").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows))
    (tmp_path / "valid-v1.3.json").write_text(json.dumps(rows[0], ensure_ascii=False) + "\n")
    train, _ = load_split({"dir": str(tmp_path)}, "train")
    assert len(train) == 20 and train[3]["choices"][3] == "c33"
    shots = pick_shots(train, 3, seed=1)
    assert shots == pick_shots(train, 3, seed=1) and len({s["q_id"] for s in shots}) == 3
    prompt = build_prompt(TEMPLATE, shots, train[0])
    assert prompt.count("答え：") == 4 and prompt.endswith("答え：") and prompt.startswith("質問：")
    assert shots[0]["choices"][shots[0]["label"]] in prompt


def test_bad_jcqa_input_is_one_line_error(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_jsonl(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"question": "q", "choice0": "a"}\n')
    with pytest.raises(DataError, match="bad.json:1"):
        read_jsonl(bad)
    bad.write_text('{"question": "q", "choices": ["a", "b"], "label": 7}\n')
    with pytest.raises(DataError, match="label 7"):
        read_jsonl(bad)
    with pytest.raises(ConfigError, match="jcqa needs data"):
        load_split({}, "validation")


def test_hub_source_goes_through_datasets(monkeypatch):
    import datasets

    calls = []

    def fake_load(name, config, split):
        calls.append((name, config, split))
        if name == "offline/none":
            raise ConnectionError("no network")
        return [{"q_id": 1, "question": "q", "choice0": "a", "choice1": "b", "choice2": "c", "choice3": "d",
                 "choice4": "e", "label": 3}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    qs, src = load_split({"hub": "some/JGLUE", "hub_config": "JCommonsenseQA"}, "validation")
    assert calls == [("some/JGLUE", "JCommonsenseQA", "validation")]
    assert qs[0]["choices"][3] == "d" and qs[0]["label"] == 3 and src == "hub:some/JGLUE/validation"
    with pytest.raises(DataError, match="cannot load offline/none"):
        load_split({"hub": "offline/none"}, "train")


# ---------------------------------------------------------------- tokenisation and templates
REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "jglue" / "jcommonsenseqa-v1.3"
needs_real = pytest.mark.skipif(not (REAL / "valid-v1.3.json").is_file(), reason="../shared/data/jglue not present")


@pytest.fixture(scope="module")
def real_tok(tmp_path_factory):
    """A SentencePiece model trained on JCommonsenseQA train text (questions and choices)."""
    from anchormass.data.tokenizer import train_tokenizer

    train = read_jsonl(REAL / "train-v1.3.json")
    texts = [q["question"] + " " + " ".join(q["choices"]) for q in train]
    return train_tokenizer(texts, tmp_path_factory.mktemp("jcqa_tok") / "tok.model", vocab_size=4000,
                           hard_vocab_limit=False)


@needs_real
@pytest.mark.parametrize("preset", ["simple", "lm_eval_harness"])
def test_continuations_are_the_joint_tokenisation_with_no_spurious_word_start(real_tok, preset, monkeypatch):
    """On all 1,119 validation questions: each scored continuation is exactly the tokens its text
    has after the prompt in the joint tokenisation; none starts with a lone "▁" unless that joint
    tokenisation has one there."""
    import anchormass.eval.suites.jcqa as jcqa

    template = resolve_template(preset)
    valid, train = read_jsonl(REAL / "valid-v1.3.json"), read_jsonl(REAL / "train-v1.3.json")
    assert len(valid) == 1119
    shots = shots_per_question(train, len(valid), 3, 1234, template["shot_sampling"])
    seen = []
    monkeypatch.setattr(jcqa, "choice_logliks", lambda model, seqs, pad, dev: seen.extend(seqs) or [0.0] * len(seqs))
    jcqa.score_questions(None, real_tok, valid, shots, template, device="cpu", batch_questions=64)
    assert len(seen) == 5 * 1119
    lone = real_tok.sp.piece_to_id("▁")
    spurious = 0
    for (ctx, cont), (n, i) in zip(seen, [(n, i) for n in range(len(valid)) for i in range(5)]):
        prompt = build_prompt(template, shots[n], valid[n])
        whole = real_tok.encode(prompt + continuations(template, valid[n])[i])
        assert cont == whole[len(ctx):]
        spurious += cont[0] == lone and whole[len(ctx)] != lone
    assert spurious == 0


@needs_real
def test_both_templates_render_question_0_as_documented():
    """The lm_eval_harness preset is ja_leaderboard_jcommonsenseqa's prompt: description, three
    shots drawn for question 0 by random.Random(1234), "\\n" before each answer, "\\n\\n" after."""
    valid, train = read_jsonl(REAL / "valid-v1.3.json"), read_jsonl(REAL / "train-v1.3.json")
    harness = resolve_template("lm_eval_harness")
    shots = shots_per_question(train, 2, 3, 1234, "per_question")
    assert [s["q_id"] for s in shots[0]] == [7220, 1914, 122] and [s["q_id"] for s in shots[1]] == [1485, 572, 1375]
    block = ("### 指示：\n出力は以下から選択してください：\n- 掲示板\n- パソコン\n- マザーボード\n- ハードディスク\n"
             "- まな板\n\n### 入力：\n電子機器で使用される最も主要な電子回路基板の事をなんと言う？\n\n### 応答：")
    first_shot = ("### 指示：\n出力は以下から選択してください：\n- 空\n- オレゴン州\n- 街\n- 歩道橋\n- 近辺\n\n"
                  "### 入力：\nある場所の周辺地域を指す言葉は？\n\n### 応答：\n近辺\n\n")
    prompt = build_prompt(harness, shots[0], valid[0])
    assert prompt.startswith("以下は、タスクを説明する指示と、文脈のある入力の組み合わせです。"
                             "要求を適切に満たす応答を書きなさい。"
                             "\n\n" + first_shot)
    assert prompt.endswith("バスタブにお湯をためる\n\n" + block) and prompt.count("### 応答：") == 4
    assert continuations(harness, valid[0])[2] == "\nマザーボード"
    simple = build_prompt(resolve_template("simple"), pick_shots(train, 3, 1234), valid[0])
    assert simple.endswith("質問：電子機器で使用される最も主要な電子回路基板の事をなんと言う？\n"
                           "選択肢：掲示板、パソコン、マザーボード、ハードディスク、まな板\n答え：")


def test_harness_shots_are_drawn_per_question_from_one_generator():
    import random

    train = [{"q_id": i, "question": f"q{i}", "choices": list("abcde"), "label": 0} for i in range(50)]
    per_q = shots_per_question(train, 4, 3, 1234, "per_question")
    rng = random.Random(1234)
    assert per_q == [rng.sample(train, 3) for _ in range(4)] and per_q[0] != per_q[1]
    fixed = shots_per_question(train, 4, 3, 1234, "fixed")
    assert fixed == [pick_shots(train, 3, 1234)] * 4
    with pytest.raises(ConfigError, match="unknown preset"):
        resolve_template("harness")
    assert resolve_template({"choices_sep": "/"})["shot"] == TEMPLATE["shot"]
