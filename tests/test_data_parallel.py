"""Pretraining data prepared by N worker processes, and as K shards merged, writes the very files one
process writes; streaming local `datasets` sources; bounded memory; token files past 2^31 tokens."""

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from anchormass.data.dataset_dir import PreparedDataset
from anchormass.data.merge import merge_shards
from anchormass.data.prepare import prepare
from anchormass.data.samples import TokenWindows
from anchormass.data.shards import ShardReader
from anchormass.data.sources import iter_documents
from anchormass.data.split_writer import split_stream
from anchormass.data.testing import tiny_pretrain
from anchormass.data.token_file import open_tokens
from anchormass.errors import ConfigError, DataError

ROOT = Path(__file__).resolve().parents[1]
WORDS = "alice bob mia went to the market with in morning red blue box code is of and a said".split()


def files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def write_corpus(folder: Path, seed: int = 0) -> None:
    """A jsonl file of multi-line documents (some blank) and a text file read one line per document."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)

    def text(n_lines):
        return "\n".join(" ".join(rng.choice(WORDS, rng.integers(3, 15))) + "." for _ in range(n_lines))

    rows = [{"text": "   " if i % 17 == 5 else text(int(rng.integers(2, 40)))} for i in range(90)]
    (folder / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "b.txt").write_text(text(100) + "\n")


def config(corpus: Path, out: Path, **extra) -> dict:
    return {"name": "par", "out_dir": str(out), "val_fraction": 0.2, "split_seed": 7, "block_docs": 8,
            "source": [{"paths": [str(corpus / "a.jsonl")], "chunk_chars": 400, "cleaners": ["whitespace"]},
                       {"paths": [str(corpus / "b.txt")], "txt_mode": "line", "limit": 37}],
            "tokenizer": {"vocab_size": 300, "model_type": "bpe", "hard_vocab_limit": False}, **extra}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """(corpus folder, the one-process folder, its config) shared by the tests below."""
    base = tmp_path_factory.mktemp("par")
    write_corpus(base / "corpus")
    out, _ = prepare(config(base / "corpus", base / "one"))
    return base / "corpus", out


def test_one_process_matches_the_documents_in_order(prepared):
    """The reference the other tests compare against: every document of iter_documents (cleaned,
    chunked, limited) encoded + eos, sent to train/val by the seeded stream, in corpus order."""
    corpus, one = prepared
    data = PreparedDataset(one)
    docs, _ = iter_documents(config(corpus, one)["source"])
    is_val = split_stream(7, 0.2)
    want = {"train": [], "val": []}
    n_docs = 0
    for doc in docs:
        want["val" if is_val() else "train"] += data.tokenizer.encode(doc) + [data.tokenizer.eos_id]
        n_docs += 1
    assert n_docs == sum(data.meta["splits"][s]["documents"] for s in want) > 100
    for split, ids in want.items():
        assert data.tokens(split).tolist() == ids


@pytest.mark.parametrize("workers", [2, 3])
def test_n_workers_write_byte_identical_files(prepared, tmp_path, workers):
    corpus, one = prepared
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out, _ = prepare(config(corpus, tmp_path / "n", num_workers=workers))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert files_of(out) == files_of(one)
    # the encoding ran in worker processes (their CPU time is counted once they are joined)
    assert after.ru_utime + after.ru_stime > before.ru_utime + before.ru_stime


@pytest.mark.parametrize("shards", [2, 3])
def test_shards_merged_are_byte_identical(prepared, tmp_path, shards):
    corpus, one = prepared
    folders = [prepare(config(corpus, tmp_path / "par", num_shards=shards, shard_index=i,
                              num_workers=2 if i == 0 else 1))[0] for i in range(shards)]
    assert [f.name for f in folders] == [f"par.shard-{i}-of-{shards}" for i in range(shards)]
    held = [sum(n for p in ShardReader(f).meta["parts"] for _, n, _ in p["blocks"]) for f in folders]
    assert all(n > 0 for n in held)  # each shard encoded its own part
    with pytest.raises(DataError, match="kind must be one of"):
        PreparedDataset(folders[0])  # a shard is not training data
    out, _ = merge_shards([str(tmp_path / f"par.shard-*-of-{shards}")], str(tmp_path / "merged"))
    assert files_of(out) == files_of(one)
    with pytest.raises(DataError, match=f"shards must be exactly shards 0..{shards - 1}"):
        merge_shards([str(f) for f in folders[:-1]], str(tmp_path / "bad"))
    assert not (tmp_path / "bad").exists()


def test_merge_refuses_shards_of_different_recipes(prepared, tmp_path):
    corpus, _ = prepared
    a = prepare(config(corpus, tmp_path / "x", num_shards=2, shard_index=0))[0]
    b = prepare(config(corpus, tmp_path / "x", num_shards=2, shard_index=1, split_seed=8))[0]
    with pytest.raises(DataError, match="prepare all shards with one recipe"):
        merge_shards([str(a), str(b)], str(tmp_path / "merged"))
    with pytest.raises(ConfigError, match="data.num_workers, data.num_shards and data.block_docs must be >= 1"):
        prepare(config(corpus, tmp_path / "y", num_workers=0))
    with pytest.raises(ConfigError, match=r"val_fraction must be in \(0, 1\)"):
        prepare(config(corpus, tmp_path / "y", num_shards=2, val_fraction=1.5))
    with pytest.raises(ConfigError, match=r"data.shard_index must be in \[0, 2\)"):
        prepare(config(corpus, tmp_path / "y", num_shards=2, shard_index=2))
    with pytest.raises(DataError, match="shard 2 of 40 got no documents"):
        prepare(config(corpus, tmp_path / "y", num_shards=40, shard_index=2, block_docs=256))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.shard-0-of-2", "x.shard-1-of-2"]


def test_merge_command_and_its_bad_input(prepared, tmp_path):
    corpus, one = prepared
    for i in range(2):
        prepare(config(corpus, tmp_path / "par", num_shards=2, shard_index=i))
    script = [sys.executable, str(ROOT / "scripts" / "merge_data.py")]
    ok = subprocess.run([*script, f"shards=[{tmp_path}/par.shard-0-of-2,{tmp_path}/par.shard-1-of-2]",
                         f"out_dir={tmp_path}/merged"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert files_of(tmp_path / "merged") == files_of(one)
    bad = subprocess.run([*script, f"shards=[{tmp_path}/missing]"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        f"error: shard folder not found: {tmp_path}/missing"]


def test_a_shard_meta_json_naming_a_folder_outside_data_is_refused(prepared, tmp_path):
    """merge_data writes data/<the name in the shards' meta.json> by default: `../../x` there must not
    make it write outside data/ (issue 34)."""
    corpus, _ = prepared
    folders = [prepare(config(corpus, tmp_path / "par", num_shards=2, shard_index=i))[0] for i in range(2)]
    for folder in folders:
        meta = json.loads((folder / "meta.json").read_text())
        meta["dataset"]["name"] = "../../escaped"
        (folder / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="dataset name '../../escaped' must be a plain folder name"):
        merge_shards([str(f) for f in folders])
    assert not (ROOT.parent / "escaped").exists() and not (ROOT / "escaped").exists()


def test_streaming_files_and_a_local_hub_folder_read_the_same(prepared, tmp_path, monkeypatch):
    """`streaming: true` (files) and kind hub on a local folder (the hub path's code, offline)
    give the same tokens as the default Arrow-cached read."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    corpus, _ = prepared
    (tmp_path / "hub_in").mkdir()
    (tmp_path / "hub_in" / "a.jsonl").write_bytes((corpus / "a.jsonl").read_bytes())
    tok = str(tmp_path / "tok.model")
    folders = {}
    for name, src in (("cached", {"paths": [str(corpus / "a.jsonl")]}),
                      ("streaming", {"paths": [str(corpus / "a.jsonl")], "streaming": True}),
                      ("hub", {"kind": "hub", "name": str(tmp_path / "hub_in"), "streaming": True})):
        cfg = {"name": name, "out_dir": str(tmp_path / name), "source": src, "num_workers": 2,
               "tokenizer": {"path": tok} if folders else {"vocab_size": 300, "model_type": "bpe",
                                                           "hard_vocab_limit": False}}
        folders[name] = prepare(cfg)[0]
        if name == "cached":
            Path(tok).write_bytes((folders[name] / "tokenizer.model").read_bytes())
    train = {name: (f / "train.bin").read_bytes() for name, f in folders.items()}
    assert train["cached"] == train["streaming"] == train["hub"] and len(train["hub"]) > 1000
    from anchormass.data.sources import _load

    assert isinstance(_load({"paths": [str(corpus / "a.jsonl")], "streaming": True})[0], datasets.IterableDataset)


_MEMORY_RUN = """
import json, sys
from anchormass.bench.peak_rss import PeakRSS
from anchormass.data.prepare import prepare
n_docs, out, tok = int(sys.argv[1]), sys.argv[2], sys.argv[3]
cfg = {"name": "mem", "out_dir": out, "num_workers": 2, "val_fraction": 0.05,
       "source": {"kind": "demo", "params": {"n_docs": n_docs, "seed": 1, "min_sentences": 600,
                                             "max_sentences": 700, "recall_docs": 0.0}},
       "tokenizer": {"path": tok} if tok != "-" else {"vocab_size": 400, "model_type": "bpe", "max_docs": 10}}
if __name__ == "__main__":
    with PeakRSS() as peak:
        _, meta = prepare(cfg)
    print(json.dumps({**peak.as_dict(), "characters": sum(s["characters"] for s in meta["splits"].values())}))
"""
MEMORY_CAP_MIB = 24  # growth allowed from a 10 MB to a 41 MB corpus, per process and in all


@pytest.mark.slow
def test_memory_is_bounded_by_blocks_not_by_the_corpus(tmp_path):
    """2 workers on the demo grammar (generated as it is read): from ~10 MB to ~41 MB of text, the
    peak RSS of main, of each worker and of all together grows by less than MEMORY_CAP_MIB, which is
    less than the 31 MB of extra text, i.e. memory is set by the blocks in flight, not the corpus."""
    (tmp_path / "run.py").write_text(_MEMORY_RUN)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(n_docs, tok):
        res = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(n_docs), str(tmp_path / f"d{n_docs}"),
                              tok], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
        assert res.returncode == 0, res.stderr[-2000:]
        return json.loads(res.stdout.strip().splitlines()[-1])

    run(300, "-")  # trains the tokenizer the measured runs reuse (training is not the part measured)
    tok = str(tmp_path / "tok.model")
    Path(tok).write_bytes((tmp_path / "d300" / "tokenizer.model").read_bytes())
    medium, big = run(300, tok), run(1200, tok)
    print("peak RSS (MiB):", {"10 MB": medium, "41 MB": big})
    assert big["characters"] - medium["characters"] > 30e6 > MEMORY_CAP_MIB * 2**20
    assert big["processes"] >= 3  # main + 2 workers were measured
    for key in ("main_mib", "largest_worker_mib", "total_mib"):
        assert big[key] - medium[key] < MEMORY_CAP_MIB, key


def test_token_files_past_2_31_tokens(tmp_path):
    """Sparse files (no 4 GiB written): a shard block that starts past 2^31 tokens / 4 GiB reads back
    the right tokens, and a pretraining window there does too."""
    big = 2**31 + 5  # tokens in the first (sparse, all-zero) document
    tail = np.arange(10, 20, dtype=np.uint16)
    shard = tmp_path / "s.shard-0-of-2"
    shard.mkdir()
    data = PreparedDataset(tiny_pretrain(tmp_path / "tiny"))
    (shard / "tokenizer.model").write_bytes((data.root / "tokenizer.model").read_bytes())
    with open(shard / "docs.bin", "wb") as fh:
        fh.truncate(big * 2)
        fh.seek(big * 2)
        fh.write(tail.tobytes())
    np.array([big, 7, tail.size, 3], dtype=np.int64).tofile(shard / "docs.idx.bin")
    meta_data = {"vocab_size": data.vocab_size, "tokenizer_checksum": data.tokenizer.checksum}
    for name, n, dtype, vocab in (("docs.bin", big + tail.size, "uint16", data.vocab_size),
                                  ("docs.idx.bin", 4, "int64", 2**62)):
        (shard / f"{name}.json").write_text(json.dumps({"dtype": dtype, "tokens": n, "vocab_size": vocab,
                                                         "tokenizer_checksum": data.tokenizer.checksum}))
    (shard / "meta.json").write_text(json.dumps({
        "kind": "pretrain_shard", "shard": {"index": 0, "count": 2}, "dataset": meta_data,
        "parts": [{"blocks": [[0, 1, big], [2, 1, int(tail.size)]]}]}))
    reader = ShardReader(shard)
    block = reader.read(0, 2)
    assert block.tokens.tolist() == tail.tolist() and block.lengths.tolist() == [10] and block.chars.tolist() == [3]
    assert os.path.getsize(shard / "docs.bin") > 2**32
    # the training side: a window of the memmapped file past 2^31 tokens
    tokens = open_tokens(shard / "docs.bin", check_ids=False)
    assert len(tokens) == big + tail.size
    seq = 4
    windows = TokenWindows(shard / "docs.bin", len(tokens), seq)
    i = big // seq  # the window where the zeros end and the tail starts
    x, y = windows.get(i)
    lo = i * seq
    expect = np.concatenate([np.zeros(max(0, big - lo), np.int64), tail.astype(np.int64)])[: seq + 1]
    assert x.tolist() == expect[:-1].tolist() and y.tolist() == expect[1:].tolist()


def test_data_benchmark_says_when_the_real_text_is_missing(tmp_path, monkeypatch):
    from anchormass.bench import data_prep

    monkeypatch.setattr(data_prep, "AOZORA", tmp_path / "missing.txt")
    with pytest.raises(DataError, match="needs the real text at .*missing.txt.*it is missing"):
        data_prep.build_corpus(tmp_path / "scratch", 1.0)
    assert not (tmp_path / "scratch").exists()


@pytest.mark.slow
@pytest.mark.skipif(not (ROOT.parent / "shared" / "data" / "aozora").is_dir(),
                    reason="../shared/data (real Aozora + JSQuAD text) not present")
def test_data_benchmark_runs_side_by_side(tmp_path):
    """scripts/bench_data.py on a 3 MB corpus: both runs, tokens/s, peak RSS, identical files."""
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_data.py"), "min_mb=3", f"out={tmp_path}"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads((tmp_path / "bench_data.json").read_text())
    assert [r["workers"] for r in result["runs"]] == [1, 2] and result["files_identical"]
    assert result["corpus"]["bytes"] >= 3e6 and all(r["tokens_per_s"] > 0 for r in result["runs"])
    assert result["runs"][1]["peak_rss"]["processes"] >= 3 and result["runs"][1]["cpu_workers_s"] > 0
