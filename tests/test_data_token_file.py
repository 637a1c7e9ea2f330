"""Token files: sidecar written with the data; truncated, mis-sized, mismatched or out-of-range files rejected."""

import json

import numpy as np
import pytest

from anchormass.data.token_file import TokenWriter, open_tokens, read_sidecar, write_tokens
from anchormass.errors import DataError


@pytest.fixture
def good(tmp_path):
    path = tmp_path / "train.bin"
    write_tokens(path, [np.arange(50), np.arange(50, 100)], vocab_size=128,
                 meta={"tokenizer_checksum": "abc", "source": "test"})
    return path


def test_round_trip_and_sidecar(good):
    arr = open_tokens(good, vocab_size=128, tokenizer_checksum="abc")
    assert arr.dtype == np.uint16 and np.array_equal(arr, np.arange(100))
    side = read_sidecar(good)
    assert side["tokens"] == 100 and side["vocab_size"] == 128 and side["dtype"] == "uint16"
    assert side["source"] == "test" and len(side["sha256"]) == 64


def test_truncated_file_rejected(good):
    data = good.read_bytes()
    good.write_bytes(data[:-2])
    with pytest.raises(DataError, match="truncated or mis-sized"):
        open_tokens(good)
    good.write_bytes(data + b"\x00")
    with pytest.raises(DataError, match="truncated or mis-sized"):
        open_tokens(good)


def test_metadata_mismatches_rejected(good):
    with pytest.raises(DataError, match="vocab size 128 does not match"):
        open_tokens(good, vocab_size=256)
    with pytest.raises(DataError, match="different tokenizer"):
        open_tokens(good, tokenizer_checksum="def")
    with pytest.raises(DataError, match="dtype"):
        open_tokens(good, dtype="uint8")


def test_ids_out_of_range_rejected(good):
    side = json.loads(good.with_name("train.bin.json").read_text())
    side["vocab_size"] = 64  # the file holds ids up to 99
    good.with_name("train.bin.json").write_text(json.dumps(side))
    with pytest.raises(DataError, match="token id 99 >= vocab size 64"):
        open_tokens(good)


def test_missing_or_broken_sidecar(good, tmp_path):
    with pytest.raises(DataError, match="not found"):
        open_tokens(tmp_path / "nope.bin")
    good.with_name("train.bin.json").write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        open_tokens(good)
    good.with_name("train.bin.json").unlink()
    with pytest.raises(DataError, match="no metadata sidecar"):
        open_tokens(good)


def test_failed_write_leaves_nothing(tmp_path):
    path = tmp_path / "x.bin"
    with pytest.raises(DataError, match="outside"):
        write_tokens(path, [np.arange(10), np.array([500])], vocab_size=128)
    with pytest.raises(DataError, match="no tokens"):
        TokenWriter(path, 128).finish({})
    assert list(tmp_path.iterdir()) == []


def test_same_input_same_bytes(tmp_path):
    for name in ("a.bin", "b.bin"):
        write_tokens(tmp_path / name, np.arange(7), vocab_size=10, meta={"source": "s"})
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()
    a, b = (json.loads((tmp_path / f"{n}.bin.json").read_text()) for n in "ab")
    assert {**a, "file": None} == {**b, "file": None}
