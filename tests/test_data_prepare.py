"""prepare_data end to end: byte-identical reruns, local sources through datasets, bad input -> one
line + exit 2 + no partial output. Optionally a run on ../shared/data (skipped when absent)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from anchormass.data.dataset_dir import PreparedDataset, fingerprint
from anchormass.data.prepare import prepare
from anchormass.data.sources import iter_documents
from anchormass.data.testing import tiny_pretrain
from anchormass.errors import ConfigError, DataError

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_rerun_is_byte_identical_and_complete(tmp_path):
    a, b = tiny_pretrain(tmp_path / "a" / "tiny"), tiny_pretrain(tmp_path / "b" / "tiny")
    assert files_of(a) == files_of(b)
    assert set(files_of(a)) == {"meta.json", "tokenizer.model", "train.bin", "train.bin.json", "val.bin",
                                "val.bin.json"}
    data = PreparedDataset(a)
    assert data.meta["vocab_size"] == 400 and len(data.tokens("val")) > 0
    assert fingerprint(a) == fingerprint(b) != fingerprint(tiny_pretrain(tmp_path / "c" / "tiny", seed=4))
    tiny_pretrain(a)  # preparing over an existing folder replaces it
    assert files_of(a) == files_of(b)
    assert [p.name for p in tmp_path.glob("*/*")] == ["tiny"] * 3  # no staging or old folders left


def test_local_sources_and_text_field(tmp_path):
    (tmp_path / "a.txt").write_text("first line\nsecond line\n\nthird line\n")
    docs, _ = iter_documents({"kind": "files", "paths": [str(tmp_path / "a.txt")], "txt_mode": "document"})
    assert list(docs) == ["first line\nsecond line\n\nthird line\n"]
    docs, _ = iter_documents({"kind": "files", "paths": [str(tmp_path / "a.txt")], "chunk_chars": 12})
    assert list(docs) == ["first line", "second line", "third line"]
    nested = {"data": [{"title": "t", "paragraphs": [{"context": "c1"}, {"context": "c2"}]},
                       {"title": "u", "paragraphs": [{"context": "c3"}]}]}
    (tmp_path / "squad.json").write_text(json.dumps(nested))
    docs, _ = iter_documents({"paths": [str(tmp_path / "squad.json")], "json_field": "data",
                              "text_field": "paragraphs.context"})
    assert list(docs) == ["c1", "c2", "c3"]
    rows = [{"body": f"doc {i}", "n": i} for i in range(5)]
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    docs, _ = iter_documents({"paths": [str(tmp_path / "r.jsonl")], "text_field": "body", "limit": 3})
    assert list(docs) == ["doc 0", "doc 1", "doc 2"]
    with pytest.raises(DataError, match="text field 'text' not found; columns are"):
        iter_documents({"paths": [str(tmp_path / "r.jsonl")]})
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pq.write_table(pa.table({"text": ["p one", "p two"]}), tmp_path / "x.parquet")
    assert list(iter_documents({"paths": [str(tmp_path / "x.parquet")]})[0]) == ["p one", "p two"]


def test_several_sources_with_their_own_cleaners(tmp_path):
    (tmp_path / "a.txt").write_text("猫《ねこ》が居る。\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "ＡＢＣ《x》"}) + "\n")
    docs, desc = iter_documents([{"paths": [str(tmp_path / "a.txt")], "cleaners": ["aozora"]},
                                 {"paths": [str(tmp_path / "b.jsonl")]}], ["nfkc"])
    assert list(docs) == ["猫が居る。", "ABC《x》"] and " + " in desc


def test_empty_corpus_leaves_nothing(tmp_path):
    (tmp_path / "empty.jsonl").write_text(json.dumps({"text": "   "}) + "\n")
    with pytest.raises(DataError):
        prepare({"name": "e", "out_dir": str(tmp_path / "out"), "source": {"paths": [str(tmp_path / "empty.jsonl")]},
                 "tokenizer": {"vocab_size": 300}})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl"]


def test_bad_out_dir_or_number_fails_before_anything_is_written(tmp_path):
    (tmp_path / "file").write_text("keep")
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("keep")
    for out in (tmp_path / "file", tmp_path / "folder"):
        with pytest.raises(ConfigError, match="not a prepared dataset folder; refusing to replace it"):
            tiny_pretrain(out)
    assert (tmp_path / "file").read_text() == (tmp_path / "folder" / "notes.txt").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder"]
    for bad, key in (({"val_fraction": "abc"}, "data.val_fraction"), ({"tokenizer": {"vocab_size": "x"}},
                                                                      "data.tokenizer.vocab_size")):
        with pytest.raises(ConfigError, match=f"{key} must be a number"):
            prepare({"name": "n", "out_dir": str(tmp_path / "n"), "source": {"kind": "demo"}, **bad})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder"]


def run_cli(*args):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "prepare_data.py"), *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=240)


@pytest.mark.slow
def test_cli_demo_and_bad_input(tmp_path):
    out = tmp_path / "demo"
    ok = run_cli("data=demo", f"data.out_dir={out}", "data.source.params.n_docs=12",
                 "data.source.params.max_sentences=200", "data.tokenizer.vocab_size=400")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["vocab_size"] == 400 and (out / "train.bin").is_file()
    bad = run_cli("data=aozora", f"data.out_dir={tmp_path / 'bad'}", f"data.source.paths=[{tmp_path}/missing.txt]")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [f"error: corpus file not found: {tmp_path}/missing.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]


@pytest.mark.skipif(not (SHARED / "aozora").is_dir(), reason="../shared/data (real Aozora text) not present")
def test_real_aozora_file_optional(tmp_path):
    out, meta = prepare({"name": "kaze", "out_dir": str(tmp_path / "kaze"), "val_fraction": 0.2,
                         "source": {"paths": [str(SHARED / "aozora" / "kaze_no_matasaburo.txt")], "chunk_chars": 2000},
                         "cleaners": ["aozora", "nfkc"],
                         "tokenizer": {"vocab_size": 1200, "hard_vocab_limit": False}})
    data = PreparedDataset(out)
    text = data.tokenizer.decode(data.tokens("train")[:400].tolist())
    assert "《" not in text and "［＃" not in text and meta["splits"]["train"]["chars_per_token"] > 1.0
