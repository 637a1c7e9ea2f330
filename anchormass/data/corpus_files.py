"""What a corpus file is before `datasets` reads it: its format (from the extension and the first
bytes, which must agree with each other and with `data.source.format` when that is set) and, when
reading fails, the first byte that does not decode (file, offset, what to set).

Without these, a `.jsonl` file read as text trained the tokenizer and the model on `{"text": ...`
and exited 0, and a Shift-JIS file failed as `cannot read corpus (DatasetGenerationError)`.
A compressed file (`.jsonl.gz`, `.txt.bz2`, `.json.xz`) is judged by what it holds: the name
without its compression suffix and the decompressed first bytes (`datasets` decompresses it by
that suffix); sniffing the compressed bytes had read a `.jsonl.gz` as text.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import json
import lzma
import re
from pathlib import Path
from typing import BinaryIO

from anchormass.errors import ConfigError, DataError

FORMATS = ("text", "json", "parquet")
EXTENSION_FORMAT = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_SNIFF_BYTES = 1 << 16
# compression -> (the suffix `datasets` decompresses by, the file's first bytes, the reader)
# (bz2: "BZh", the block size digit, then a block's or the end's magic: a text may begin "BZh")
COMPRESSIONS = {"gzip": (".gz", re.compile(rb"\x1f\x8b"), gzip.open),
                "bz2": (".bz2", re.compile(rb"BZh[1-9](\x31\x41\x59\x26\x53\x59|\x17\x72\x45\x38\x50\x90)"),
                        bz2.open),
                "xz": (".xz", re.compile(rb"\xfd7zXZ\x00"), lzma.open)}
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def compression_of(path: str) -> str | None:
    """The file's compression, by its first bytes; a compressed file must carry the suffix
    `datasets` decompresses by, and a suffix must not promise a compression the bytes lack."""
    with open(path, "rb") as f:
        head = f.read(10)
    if head.startswith(_ZSTD_MAGIC) or Path(path).suffix.lower() == ".zst":  # datasets needs zstandard for it
        raise DataError(f"{path} is zstd-compressed, which this environment does not read; decompress it "
                        f"(zstd -d) or recompress it as .gz")
    found = next((name for name, (_, magic, _) in COMPRESSIONS.items() if magic.match(head)), None)
    suffix = Path(path).suffix.lower()
    named = next((name for name, (ext, _, _) in COMPRESSIONS.items() if ext == suffix), None)
    if found != named:
        what = f"{found}-compressed" if found else "not compressed"
        fix = f"name it ...{COMPRESSIONS[found][0]}" if found else f"drop the {suffix} suffix"
        raise DataError(f"{path} is {what} but named {Path(path).name}; {fix}")
    return found


def open_content(path: str) -> BinaryIO:
    """The file's bytes as `datasets` reads them: decompressed where it is compressed."""
    kind = compression_of(path)
    return COMPRESSIONS[kind][2](path, "rb") if kind else open(path, "rb")


def inner_name(path: str) -> Path:
    """`a.jsonl.gz` -> `a.jsonl`: the name that says what a compressed file holds."""
    p = Path(path)
    return p.with_suffix("") if any(p.suffix.lower() == ext for ext, _, _ in COMPRESSIONS.values()) else p


def content_format(path: str) -> str:
    """parquet (its magic bytes), json (an object or array: a first line that parses, or that
    opens a longer document), else text; of the decompressed bytes."""
    try:
        with open_content(path) as f:
            head = f.read(_SNIFF_BYTES)
    except (OSError, EOFError, lzma.LZMAError) as err:  # a damaged archive
        raise DataError(f"{path}: cannot decompress it ({err})") from None
    if head.startswith(b"PAR1"):
        return "parquet"
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if not text.startswith(("{", "[")):
        return "text"
    first, newline, _ = text.partition("\n")
    first = first.strip()
    if not newline and len(head) == _SNIFF_BYTES or first.endswith(("{", "[", ",", ":")):
        return "json"  # one long JSON document, or a pretty-printed one
    try:
        return "json" if isinstance(json.loads(first), (dict, list)) else "text"
    except ValueError:
        return "text"


def files_format(paths: list[str], fmt: str | None) -> str:
    """The one format of `paths`; `fmt` (data.source.format) if set, which the files must not
    contradict. A disagreement is one ConfigError naming the file and the setting to change."""
    if fmt and fmt not in FORMATS:
        raise ConfigError(f"data.source.format must be text, json or parquet, got {fmt!r}")
    found: dict[str, str] = {}
    for path in paths:
        by_name = EXTENSION_FORMAT.get(inner_name(path).suffix.lower())
        by_content = content_format(path)
        if by_content == "parquet" and compression_of(path):
            raise DataError(f"{path} is a compressed parquet file, which `datasets` does not read; "
                            f"decompress it (parquet compresses its own columns)")
        if by_name and by_content != by_name and not (by_name == fmt == "text"):  # text: the user's word
            raise DataError(f"{path} is named as {by_name} but its content is {by_content}; "
                            f"rename it or fix its content")
        own = by_name or by_content
        if fmt and own != fmt:
            raise ConfigError(f"{path} is {own} but data.source.format={fmt}; set data.source.format={own} "
                              f"(or null: the format follows the files)")
        found[path] = own
    kinds = set(found.values())
    if len(kinds) != 1:
        listing = ", ".join(f"{Path(p).name}: {k}" for p, k in found.items())
        raise ConfigError(f"the corpus files mix formats ({listing}); give one format per source")
    return kinds.pop()


def decode_problem(paths: list[str], encoding: str) -> str | None:
    """Where the first byte of `paths` that `encoding` cannot decode is, as a one-line message
    naming the file, the byte offset and the option to set; None if every file decodes."""
    try:
        codecs.lookup(encoding)
    except LookupError:
        return f"unknown data.source.encoding {encoding!r} (e.g. utf-8, shift_jis, cp932, euc_jp)"
    for path in paths:
        decoder = codecs.getincrementaldecoder(encoding)()
        offset = 0  # of the block read next (in the decompressed bytes)
        with open_content(path) as f:
            while True:
                pending = decoder.getstate()[0]  # bytes of a character the last block cut in two
                block = f.read(1 << 20)
                try:
                    decoder.decode(block, final=not block)
                except UnicodeDecodeError as err:
                    where = offset - len(pending) + err.start
                    bad = bytes(err.object[err.start:err.start + 4]).hex(" ")
                    inside = " of its decompressed content" if compression_of(path) else ""
                    return (f"{path}: byte offset {max(where, 0)}{inside} (bytes {bad}) is not valid {encoding}; "
                            f"set data.source.encoding to the file's encoding (e.g. data.source.encoding=shift_jis)")
                if not block:
                    break
                offset += len(block)
    return None


def raise_decode_problem(err: BaseException, paths: list[str], encoding: str) -> None:
    """If `err` (from `datasets`) comes from undecodable bytes, raise the DataError that says where."""
    seen = err
    while seen is not None and not isinstance(seen, (UnicodeDecodeError, LookupError)):
        seen = seen.__cause__ or seen.__context__
    if seen is None:
        return
    problem = decode_problem(paths, encoding)
    if problem:
        raise DataError(problem) from None
