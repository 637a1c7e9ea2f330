"""Tokenizer: reserved ids, role markers, text -> ids -> text round trip, checksum, bad files."""

import hashlib

import pytest

from anchormass.data.demo_corpus import demo_documents
from anchormass.data.tokenizer import ROLE_MARKERS, Tokenizer, train_tokenizer
from anchormass.errors import DataError


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.model"
    docs = list(demo_documents(n_docs=6, seed=1, min_sentences=40, max_sentences=60))
    return train_tokenizer(docs + ["吾輩は猫である。名前はまだ無い。"] * 3, path, 400, model_type="bpe")


def test_reserved_ids_and_markers(tok):
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    assert [tok.system_id, tok.user_id, tok.assistant_id, tok.end_id] == [4, 5, 6, 7]
    assert tok.vocab_size == 400
    # a marker in text is one token, never split
    ids = tok.encode("hi <|user|> there")
    assert tok.user_id in ids and all(tok.id_to_piece(i) not in ("<|", "|>") for i in ids)
    assert [tok.encode(m)[-1] for m in ROLE_MARKERS] == [4, 5, 6, 7]


@pytest.mark.parametrize("text", [
    "Alice found a small red box in the garden. The code of the red box is 4821.",
    "Unseen words: zebra quokka, and digits 0123456789.",
    "吾輩は猫である。名前はまだ無い。どこで生れたか見当がつかぬ。",  # mostly byte fallback
    "line one\nline two",
    "two  spaces,  kept",
])
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids) and tok.unk_id not in ids
    assert tok.decode(ids) == text


def test_digits_are_split(tok):
    pieces = [tok.id_to_piece(i) for i in tok.encode("48213")]
    assert [p.strip("▁") for p in pieces if p.strip("▁")] == list("48213")


def test_load_checksum_and_determinism(tok, tmp_path):
    again = Tokenizer.load(tok.path)
    assert again.checksum == hashlib.sha256(open(tok.path, "rb").read()).hexdigest() == tok.checksum
    docs = list(demo_documents(n_docs=6, seed=1, min_sentences=40, max_sentences=60))
    retrained = train_tokenizer(docs + ["吾輩は猫である。名前はまだ無い。"] * 3, tmp_path / "t.model", 400,
                                model_type="bpe")
    assert retrained.checksum == tok.checksum


def test_bad_inputs(tmp_path):
    with pytest.raises(DataError, match="not found"):
        Tokenizer.load(tmp_path / "missing.model")
    (tmp_path / "junk.model").write_bytes(b"not a model")
    with pytest.raises(DataError, match="not a SentencePiece model"):
        Tokenizer.load(tmp_path / "junk.model")
    with pytest.raises(DataError, match="empty corpus"):
        train_tokenizer(["", "  \n "], tmp_path / "e.model", 300)
    with pytest.raises(DataError, match="vocab_size"):
        train_tokenizer(["x"], tmp_path / "v.model", 100_000)
    assert not (tmp_path / "e.model").exists()
