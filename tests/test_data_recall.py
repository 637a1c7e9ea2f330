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
