import json

import pytest
import torch

from anchormass.errors import ConfigError, DataError
from anchormass.eval.jcqa import choice_logliks, score_questions
from anchormass.eval.jcqa_data import TEMPLATE, build_prompt, load_split, pick_shots, read_jsonl


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
    res = score_questions(RiggedModel(fav), tok, qs, [], TEMPLATE, device="cpu", batch_questions=2)
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
    assert prompt.count("答え：") == 4 and prompt.endswith("答え：")
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
