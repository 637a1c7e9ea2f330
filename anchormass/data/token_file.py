"""Flat uint16 token files with a JSON sidecar (docs/method.md §4), and the reader that checks them.

`<name>.bin` holds token ids back to back (documents separated by eos); `<name>.bin.json` says
what they are: dtype, token count, vocab size, tokenizer checksum, source description and the
sha256 of the .bin (computed while writing, so fingerprints never re-read gigabytes).
Loss-mask files (`<name>.mask.bin`, uint8, one byte per token) use the same writer/reader.

Integrity (data/README.md): every `open_tokens` checks the file's size against the sidecar (cheap);
`verify_token_file` re-hashes the whole file against the sidecar's sha256, which catches a flipped
id that is still in range. Training runs it on every split file when a run starts
(dataset_dir.verify_dataset). Cost, measured with `sha256_file` on a 1 GiB file in the page cache
on the 2-core dev machine under load: 1.6-2.1 s (~0.5-0.65 GB/s; a cold file adds the disk's read
time), against minutes to days of training, so it runs at every start (data/README.md).
A full disk while writing is one DataError line naming the file and the space needed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from anchormass.errors import DataError
from anchormass.utils import AtomicFile, atomic_write_json, disk_full_as, sha256_file

TOKEN_DTYPE = "uint16"
_CHECK_CHUNK = 1 << 24  # tokens per chunk when scanning ids (bounded memory on multi-GB files)


# What a damaged token file needs: it is generated, so rebuild it rather than repair it.
REBUILD = "re-run scripts/prepare_data.py for this dataset to rebuild it"


def dtype_capacity(dtype: str) -> int:
    """How many distinct ids a token file of `dtype` holds (65,536 for uint16)."""
    return int(np.iinfo(dtype).max) + 1


def _check_capacity(name: str, vocab_size: int, dtype: str) -> None:
    # a larger vocabulary would wrap ids silently when cast to the file's dtype
    if int(vocab_size) > dtype_capacity(dtype):
        raise DataError(f"{name}: a vocabulary of {vocab_size} ids does not fit {dtype} token files "
                        f"(at most {dtype_capacity(dtype)})")


def sidecar_path(path: str | os.PathLike) -> Path:
    return Path(f"{path}.json")


class TokenWriter:
    """Append arrays of ids to `path`; `finish(meta)` writes the sidecar and moves both into place.

    Ids are checked against `vocab_size` as they arrive. If `finish` is never reached (an error,
    a crash) nothing appears at `path`: data goes to a temp file in the same folder first."""

    def __init__(self, path: str | os.PathLike, vocab_size: int, dtype: str = TOKEN_DTYPE):
        self.path, self.vocab_size, self.dtype = Path(path), int(vocab_size), dtype
        _check_capacity(self.path.name, self.vocab_size, dtype)
        self._file = AtomicFile(self.path)
        self._fh = open(self._file.tmp, "wb")
        self._digest, self.count = hashlib.sha256(), 0

    def write(self, ids) -> None:
        arr = np.asarray(ids)
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
            bad = int(arr.max()) if arr.max() >= self.vocab_size else int(arr.min())
            self.abort()
            raise DataError(f"{self.path.name}: id {bad} outside [0, {self.vocab_size})")
        data = arr.astype(self.dtype, copy=False).tobytes()
        self._digest.update(data)
        with self._disk_full(len(data)):
            self._fh.write(data)
        self.count += arr.size

    def _disk_full(self, more: int = 0):
        """ENOSPC -> one DataError line (the temp file removed first): the bytes this file needed
        so far, a lower bound since the total is not known while streaming."""
        def needed() -> int:
            self.abort()
            return self.count * np.dtype(self.dtype).itemsize + more
        return disk_full_as(DataError, self.path, needed, at_least=True)

    def finish(self, meta: dict[str, Any] | None = None) -> dict[str, Any]:
        with self._disk_full():
            self._fh.close()  # flushes the last buffered block
        if self.count == 0:
            self.abort()
            raise DataError(f"{self.path.name}: no tokens to write (empty corpus or split)")
        side = {**(meta or {}), "vocab_size": self.vocab_size, "dtype": self.dtype, "tokens": self.count,
                "sha256": self._digest.hexdigest(), "file": self.path.name}
        # Two renames are not one atomic step; prepare_data builds a whole dataset folder in a
        # staging folder and renames that, so a crash never leaves a mixed pair in data/<name>.
        try:
            with self._disk_full():
                atomic_write_json(sidecar_path(self.path), side, sort_keys=True, indent=2)
                self._file.commit()
        except BaseException:
            self.abort()
            raise
        return side

    def abort(self) -> None:
        if not self._fh.closed:
            try:
                self._fh.close()
            except OSError:  # a full disk cannot flush a buffer that is deleted next anyway
                pass
        self._file.discard()


def write_tokens(path: str | os.PathLike, ids, vocab_size: int, meta: dict[str, Any] | None = None,
                 dtype: str = TOKEN_DTYPE) -> dict[str, Any]:
    """Write one array (or an iterable of arrays) of ids plus its sidecar; returns the sidecar."""
    writer = TokenWriter(path, vocab_size, dtype)
    try:
        single = isinstance(ids, np.ndarray) or (isinstance(ids, list) and bool(ids) and np.isscalar(ids[0]))
        for chunk in ([ids] if single else ids):
            writer.write(chunk)
    except BaseException:
        writer.abort()
        raise
    return writer.finish(meta)


def read_sidecar(path: str | os.PathLike) -> dict[str, Any]:
    side = sidecar_path(path)
    if not Path(path).is_file():
        raise DataError(f"token file not found: {path}")
    if not side.is_file():
        raise DataError(f"token file {path} has no metadata sidecar {side.name}")
    try:
        meta = json.loads(side.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"metadata {side} is not valid JSON ({err.msg if hasattr(err, 'msg') else err})") from err
    for key in ("dtype", "tokens", "vocab_size"):
        if key not in meta:
            raise DataError(f"metadata {side} lacks '{key}'")
    return meta


def open_tokens(path: str | os.PathLike, *, vocab_size: int | None = None, tokenizer_checksum: str | None = None,
                check_ids: bool = True, dtype: str = TOKEN_DTYPE) -> np.memmap:
    """Memory-map a token file after checking it against its sidecar (and the caller's expectations).

    Rejects: missing file/sidecar, dtype other than `dtype`, size != tokens * itemsize, a vocab size
    or tokenizer checksum different from the caller's, ids >= the sidecar's vocab size."""
    meta = read_sidecar(path)
    name = Path(path).name
    if meta["dtype"] != dtype:
        raise DataError(f"{name}: metadata says dtype {meta['dtype']}, expected {dtype}")
    itemsize = np.dtype(dtype).itemsize
    size = os.path.getsize(path)
    if size != int(meta["tokens"]) * itemsize:
        raise DataError(f"token file {path} is corrupt: {size} bytes but its sidecar says {meta['tokens']} tokens "
                        f"x {itemsize} bytes (truncated or mis-sized file); {REBUILD}")
    _check_capacity(name, int(meta["vocab_size"]), dtype)
    if vocab_size is not None and int(meta["vocab_size"]) != int(vocab_size):
        raise DataError(f"{name}: vocab size {meta['vocab_size']} does not match the expected {vocab_size}")
    if tokenizer_checksum is not None and meta.get("tokenizer_checksum") != tokenizer_checksum:
        raise DataError(f"{name}: made with a different tokenizer (checksum {str(meta.get('tokenizer_checksum'))[:12]}"
                        f" vs {tokenizer_checksum[:12]})")
    if size == 0:
        raise DataError(f"{name}: empty token file")
    arr = np.memmap(path, dtype=dtype, mode="r")
    if check_ids:
        limit = int(meta["vocab_size"])
        for start in range(0, arr.size, _CHECK_CHUNK):
            top = int(arr[start:start + _CHECK_CHUNK].max())
            if top >= limit:
                raise DataError(f"{name}: token id {top} >= vocab size {limit}")
    return arr


def verify_token_file(path: str | os.PathLike) -> None:
    """Re-hash the whole file and compare with its sidecar's sha256 (written while the file was).

    Reads every byte: run once when a training run starts, not on every open (open_tokens checks
    the size, which catches truncation but not a changed id). A sidecar without sha256 (none of
    ours) is left unchecked."""
    want = read_sidecar(path).get("sha256")
    if not want:
        return
    got = sha256_file(path)
    if got != want:
        raise DataError(f"token file {path} is corrupt: its sha256 {got[:12]} differs from the one its sidecar "
                        f"recorded ({want[:12]}); {REBUILD}")
