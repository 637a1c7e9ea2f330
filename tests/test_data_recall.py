"""Retrieval-dense demo data: the passkey haystacks are laid out as the passkey suite lays out its
prompts, copy lists repeat exactly, the default corpus is unchanged, and long-context SFT mixes in
MQAR items with the loss on their asked values only."""

import random
import re

import numpy as np

from anchormass.data.demo_corpus import copy_document, demo_documents, passkey_document
from anchormass.data.longctx import LongContextSpec, build_examples
from anchormass.data.mqar import MQARVocab


def test_passkey_documents_state_the_key_twice_and_answer_it():
    rng = random.Random(0)
    docs = [passkey_document(rng) for _ in range(200)]
    for doc in docs:
        key = re.search(r"The passkey is (\d{4})\. Remember it\. \1 is the passkey\.", doc).group(1)
        assert doc.endswith(f"Question: What is the passkey? Answer: The passkey is {key}.")
    # the suite concatenates pieces in token space: a lone space piece, i.e. two spaces in text
    assert sum("passkey.  " in d for d in docs) > 50


def test_copy_documents_repeat_their_list():
    rng = random.Random(1)
    for _ in range(50):
        first, second = re.fullmatch(r"The list is (.+)\. Again, the list is (.+)\.", copy_document(rng)).groups()
        assert first == second and len(first.split()) >= 6


def test_default_corpus_is_unchanged_and_recall_docs_replace_documents():
    assert list(demo_documents(n_docs=4, seed=5)) == list(demo_documents(n_docs=4, seed=5, recall_docs=0.0))
    mixed = list(demo_documents(n_docs=40, seed=5, recall_docs=0.5, recall_per_doc=3))
    recall = [d for d in mixed if d.startswith(("The list is", "The ")) and "\n\n" in d]
    assert 10 <= len(recall) <= 30


class _Tok:
    vocab_size, eos_id = 1024, 3

    def encode(self, text):
        return [10 + (ord(c) % 200) for c in text]

    def id_to_piece(self, i):
        return "."


def test_longctx_mixes_mqar_items_with_loss_on_values_only():
    vocab = {"keys": [256, 512], "values": [512, 768], "noise": [768, 1024]}
    spec = LongContextSpec(length=200, n_facts=2, mqar_fraction=0.5, mqar={"vocab": vocab, "n_pairs": 8, "alpha": 1.0})
    source = np.random.default_rng(0).integers(10, 200, 5000)
    examples = list(build_examples(source, _Tok(), spec, 40, seed=1))
    v = MQARVocab.from_config(vocab)
    mqar = [(ids, mask) for ids, mask in examples if all(t >= 256 for t in ids)]
    assert 8 <= len(mqar) <= 32 and all(len(ids) == 200 for ids, _ in examples)
    for ids, mask in mqar:
        targets = [t for t, m in zip(ids, mask) if m]
        assert len(targets) == 8 and all(v.values[0] <= t < v.values[1] for t in targets)


class _PieceTok(_Tok):
    """Encodes words to ids (so 'passkey' is one id) and ends sentences with id 11 ('.')."""

    def __init__(self):
        self.ids = {".": 11}

    def encode(self, text):
        for mark in ".?:,":
            text = text.replace(mark, " " + mark)
        return [self.ids.setdefault(w, 20 + len(self.ids)) for w in text.split()]

    def id_to_piece(self, i):
        return "." if i == 11 else "w"


def test_recall_sft_episodes_fill_the_example_with_answers_and_one_passkey_each():
    tok = _PieceTok()
    spec = LongContextSpec(length=600, n_facts=4, kinds=("passkey", "kv"), episode_len=(64, 160), classic_filler=0.5,
                           templates={"passkey": {"fact": "The passkey is {value}. Remember it.",
                                                  "question": "Question: What is the passkey? Answer:",
                                                  "answer": "The passkey is {value}."},
                                      "kv": {"fact": "The value of {key} is {value}.",
                                             "question": "Question: What is the value of {key}? Answer:",
                                             "answer": "The value of {key} is {value}."}})
    passkey, what = tok.encode("passkey")[0], tok.encode("What")[0]
    # a source that names a passkey every 40 sentences: the filler drops those sentences
    words = ("a b c d e . " * 39 + "the passkey f . ") * 60
    source = np.asarray([tok.encode(w)[0] for w in words.split()])
    examples = list(build_examples(source, tok, spec, 20, seed=3))
    assert examples == list(build_examples(source, tok, spec, 20, seed=3))  # deterministic
    answers = 0
    for ids, mask in examples:
        assert len(ids) == len(mask) == 600 and mask[0] == 0
        answers += sum(1 for a, b in zip(mask, mask[1:] + [0]) if a == 1 and b == 0)
        # passkey mentions come only from the episodes' own fact, question and answer (3 each;
        # the cut last episode may hold one more or one fewer), never from the filler
        asked = sum(1 for i in range(len(ids) - 3) if ids[i] == what and ids[i + 3] == passkey)
        assert ids.count(passkey) - 3 * asked in (-1, 0, 1)
    assert answers >= 20 * 600 // 160 - 20  # several answers per example, not one
    assert any(tok.encode("grass")[0] in ids for ids, _ in examples)  # classic filler is used


def test_episode_len_is_checked():
    import pytest

    from anchormass.errors import ConfigError

    with pytest.raises(ConfigError, match="episode_len"):
        LongContextSpec(length=200, episode_len=(32, 100))
    with pytest.raises(ConfigError, match="episode_len"):
        LongContextSpec(length=200, episode_len=(64, 300))


def test_code_copy_documents_repeat_their_digits():
    from anchormass.data.demo_corpus import code_copy_document

    rng = random.Random(2)
    for _ in range(50):
        first, second = re.fullmatch(r"The code is (\d+)\. Again, the code is (\d+)\.",
                                     code_copy_document(rng)).groups()
        assert first == second and 4 <= len(first) <= 8


def test_filler_drops_the_sentences_that_name_a_passkey():
    from anchormass.data.longctx import without_sentences_naming

    ends = np.zeros(100, dtype=bool)
    ends[11] = True  # id 11 ends a sentence
    source = np.asarray([20, 21, 11, 22, 50, 23, 11, 24, 11, 50, 11, 25])
    assert without_sentences_naming(source, ends, 50).tolist() == [20, 21, 11, 24, 11, 25]
