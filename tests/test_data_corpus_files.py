"""Corpus files as users hand them over (issue 37): the format follows the file (extension and
content) or a mismatch is one line; undecodable bytes name the file, the byte offset and the
option to set; a corpus without line breaks is cut into documents."""

import json

import pytest
from omegaconf import OmegaConf

from anchormass.data.prepare import prepare
from anchormass.data.sources import documents_of, iter_documents
from anchormass.errors import ConfigError, DataError

from _train_helpers import REPO

TEXTS = ["吾輩は猫である。名前はまだ無い。", "どこで生れたかとんと見当がつかぬ。"]


def aozora(**changes) -> dict:
    """configs/data/aozora.yaml as prepare_data.py composes it, with `changes` merged in."""
    cfg = OmegaConf.merge(OmegaConf.load(REPO / "configs" / "data" / "aozora.yaml"), changes)
    return OmegaConf.to_container(cfg, resolve=True)


def read(cfg: dict) -> list[str]:
    docs, _ = iter_documents(cfg["source"], cfg["cleaners"])
    return list(docs)


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": t, "id": i}, ensure_ascii=False) + "\n" for i, t in enumerate(TEXTS)),
                    encoding="utf-8")
    return path


def test_data_aozora_reads_the_text_field_of_a_jsonl_corpus(jsonl):
    docs = read(aozora(source={"paths": [str(jsonl)]}))
    assert docs == TEXTS   # before: one document of JSON syntax ('{"text": "吾輩は...', "id": 0}...)
    assert not any("{" in d or '"text"' in d for d in docs)


@pytest.mark.parametrize("setting, name, content, message", [
    ("text", "corpus.jsonl", "jsonl", "corpus.jsonl is json but data.source.format=text; set data.source.format=json"),
    ("json", "corpus.txt", "text", "corpus.txt is text but data.source.format=json; set data.source.format=text"),
    (None, "corpus.txt", "jsonl", "corpus.txt is named as text but its content is json"),
    (None, "corpus.jsonl", "text", "corpus.jsonl is named as json but its content is text"),
])
def test_a_format_the_file_contradicts_is_one_line(tmp_path, jsonl, setting, name, content, message):
    path = tmp_path / name
    path.write_bytes(jsonl.read_bytes() if content == "jsonl" else "\n".join(TEXTS).encode())
    with pytest.raises((ConfigError, DataError)) as err:
        read(aozora(source={"paths": [str(path)], "format": setting}))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_undecodable_bytes_name_the_file_the_offset_and_the_option(tmp_path):
    path = tmp_path / "sjis.txt"
    prefix = "ascii line\n".encode()
    path.write_bytes(prefix + "\n".join(TEXTS).encode("shift_jis"))
    with pytest.raises(DataError) as err:
        read(aozora(source={"paths": [str(path)]}))
    message = str(err.value)   # before: "cannot read corpus (DatasetGenerationError): An error occurred ..."
    assert str(path) in message and f"byte offset {len(prefix)}" in message
    assert "data.source.encoding" in message
    docs = read(aozora(source={"paths": [str(path)], "encoding": "shift_jis"}))
    assert "吾輩は猫である" in docs[0]


def test_a_corpus_without_line_breaks_is_cut_into_documents():
    text = "".join(f"{i}番目の文はここで終わる。" for i in range(20_000))   # ~270k characters, one line
    docs = documents_of(text, [], 4000)
    assert len(docs) > 60 and max(map(len, docs)) <= 4000   # before: one document of the whole file
    assert "".join(docs) == text and all(d.endswith("。") for d in docs)
    unbroken = "字" * 9000   # no sentence end or space at all: cut at the limit
    assert [len(d) for d in documents_of(unbroken, [], 4000)] == [4000, 4000, 1000]


def test_prepare_splits_a_single_line_corpus(tmp_path):
    """The whole route: before, one document, an empty split and "the corpus is empty or too small"."""
    path = tmp_path / "one_line.txt"
    path.write_text("".join(f"{'春夏秋冬'[i % 4]}の{i % 97}日目に猫が{i % 13}匹いた。" for i in range(6000)),
                    encoding="utf-8")
    cfg = aozora(out_dir=str(tmp_path / "prepared"), source={"paths": [str(path)], "chunk_chars": 2000},
                 tokenizer={"vocab_size": 300, "model_type": "bpe"})
    out, meta = prepare(cfg)
    assert (out / "train.bin").stat().st_size > 0 and (out / "val.bin").stat().st_size > 0
