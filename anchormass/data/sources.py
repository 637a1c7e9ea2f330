"""Read a corpus as a stream of documents through `datasets` (docs/method.md §4).

A source is a mapping from the data config (`configs/data/*.yaml`, key `source`), or a list of
them (read in order, each with an optional own `cleaners`):

    kind: files          # files | hub | demo | demo_chat (generated corpora: `params` for the generator)
    paths: [a.txt]       # files: paths or globs (relative to the repo root or absolute)
    format: null         # files: text | json | parquet; null = from the files (.txt .jsonl .json .parquet and
                         # the content, which must agree; corpus_files.py). A set format the files contradict is refused
    encoding: utf-8      # files, text / json: the files' encoding (shift_jis, cp932, euc_jp, ...)
    json_field: null     # json: the top-level key holding the records (e.g. "data" in SQuAD files)
    text_field: text     # column; a dotted path descends into nested records, lists are flattened
                         # ("paragraphs.context": every paragraph's context is one document)
    txt_mode: document   # text: document (a file is one document) | paragraph | line
    streaming: false     # files and hub: read records as they are used (bounded memory; big corpora)
    name: null           # hub: dataset name (or a local folder of json/parquet files); config_name, split (train)
    limit: null          # at most this many documents
    chunk_chars: null    # cut longer documents at line ends into pieces of about this many characters
"""

from __future__ import annotations

import glob
import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from anchormass.data.cleaners import clean, get_cleaners
from anchormass.data.corpus_files import files_format, raise_decode_problem
from anchormass.errors import ConfigError, DataError
from anchormass.utils import resolve_path

_SAMPLE_BY = {"document": "document", "paragraph": "paragraph", "line": "line"}


def _expand(paths: Iterable[str]) -> list[str]:
    out: list[str] = []
    for pattern in paths:
        full = str(resolve_path(pattern))
        hits = sorted(glob.glob(full)) if glob.has_magic(full) else ([full] if os.path.isfile(full) else [])
        if not hits:
            raise DataError(f"corpus file not found: {pattern}")
        out.extend(hits)
    return out


def _walk(record: Any, parts: list[str], field: str) -> Iterator[str]:
    """Yield the strings at dotted path `parts` inside `record`, flattening lists on the way."""
    if isinstance(record, list):
        for item in record:
            yield from _walk(item, parts, field)
        return
    if not parts:
        if record is None:
            return
        if not isinstance(record, str):
            raise DataError(f"text field '{field}' holds {type(record).__name__}, not text")
        yield record
        return
    if not isinstance(record, Mapping) or parts[0] not in record:
        have = sorted(record) if isinstance(record, Mapping) else type(record).__name__
        raise DataError(f"text field '{field}' not found (at '{parts[0]}'; available: {have})")
    yield from _walk(record[parts[0]], parts[1:], field)


_SENTENCE_ENDS = "。．！？!?.\u3000 "


def _cut_line(line: str, max_chars: int) -> Iterator[str]:
    """A line longer than max_chars, in pieces of at most max_chars: each cut after the last
    sentence end or space of its window, or at max_chars where the window's second half has none
    (a corpus without line breaks is still many documents, not one)."""
    while len(line) > max_chars:
        window = line[:max_chars]
        cut = max(window.rfind(c) for c in _SENTENCE_ENDS) + 1
        if cut <= max_chars // 2:
            cut = max_chars
        yield line[:cut]
        line = line[cut:]
    yield line


def _chunk(doc: str, max_chars: int) -> Iterator[str]:
    """Cut at line ends into pieces of about max_chars; a longer line is cut inside (_cut_line)."""
    piece: list[str] = []
    size = 0
    for whole_line in doc.split("\n"):
        for line in _cut_line(whole_line, max_chars):
            if piece and size + len(line) > max_chars:
                yield "\n".join(piece).strip()
                piece, size = [], 0
            piece.append(line)
            size += len(line) + 1
    if piece and "\n".join(piece).strip():
        yield "\n".join(piece).strip()


# source kinds read through the `datasets` library (the [data] extra of an installed package)
DATASETS_KINDS = ("files", "hub")


def require_readers(source: Any) -> None:
    """One line when a source (or a list of them) needs a library that is not installed."""
    from anchormass.extras import require

    for src in source if isinstance(source, (list, tuple)) or hasattr(source, "append") else [source]:
        kind = (src or {}).get("kind")
        if kind in DATASETS_KINDS:
            require("data", f"data.source.kind={kind}")


def _load(src: Mapping[str, Any]):
    """A datasets Dataset / IterableDataset and a one-line description of where it came from."""
    require_readers(src)
    import datasets

    datasets.disable_progress_bars()  # our own tqdm reports documents; datasets' bars are noise here
    kind = src.get("kind", "files")
    try:
        if kind == "files":
            paths = _expand(src.get("paths") or [])
            if not paths:
                raise ConfigError("source.paths is empty")
            fmt = files_format(paths, src.get("format"))
            kwargs: dict[str, Any] = {}
            if fmt != "parquet":
                kwargs["encoding"] = str(src.get("encoding") or "utf-8")
            if fmt == "text":
                mode = src.get("txt_mode", "document")
                if mode not in _SAMPLE_BY:
                    raise ConfigError(f"source.txt_mode must be one of {sorted(_SAMPLE_BY)}, got {mode!r}")
                kwargs["sample_by"] = _SAMPLE_BY[mode]
            if fmt == "json" and src.get("json_field"):
                kwargs["field"] = src["json_field"]
            # streaming: records are read as they are used (bounded memory, no Arrow cache copy of
            # the corpus); the same records in the same order as without it.
            ds = datasets.load_dataset(fmt, data_files=paths, split="train", streaming=bool(src.get("streaming")),
                                       **kwargs)
            here = str(Path.cwd())
            names = ", ".join(os.path.relpath(p, here) if p.startswith(here) else p for p in paths)
            return ds, f"files[{fmt}]: {names}"
        if kind == "hub":
            if not src.get("name"):
                raise ConfigError("source.name (a hub dataset) is required for kind=hub")
            ds = datasets.load_dataset(src["name"], src.get("config_name"), split=src.get("split", "train"),
                                       streaming=bool(src.get("streaming", False)))
            return ds, f"hub: {src['name']}" + (f"/{src['config_name']}" if src.get("config_name") else "") + \
                f" split={src.get('split', 'train')}"
    except (ConfigError, DataError):
        raise
    except Exception as err:  # datasets raises many types (FileNotFoundError, ConnectionError, ArrowInvalid, ...)
        if kind == "files":  # undecodable bytes: the file, the offset and the option to set
            raise_decode_problem(err, paths, str(src.get("encoding") or "utf-8"))
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DataError(f"cannot read corpus ({type(err).__name__}): {msg[:300]}") from err
    raise ConfigError(f"source.kind must be files, hub or demo, got {kind!r}")


@dataclass(frozen=True)
class SourcePart:
    """One source of a data config, ready to read: its raw texts (as `datasets` or the generator
    gives them) and what turns each into documents (`documents_of`). Kept apart so that cleaning
    and chunking can run in worker processes next to the tokenizer (parallel_encode.py)."""

    texts: Callable[[], Iterator[str]]  # a fresh stream of raw texts per call
    cleaners: tuple[str, ...]
    chunk_chars: int | None
    limit: int | None
    desc: str


def documents_of(text: str, cleaner_fns: list[Callable[[str], str]], chunk_chars: int | None) -> list[str]:
    """The documents one raw text becomes: cleaned whole (so e.g. the Aozora header is seen), cut
    into chunks, empty / whitespace-only pieces dropped."""
    text = clean(text, cleaner_fns) if cleaner_fns else text
    pieces = _chunk(text, int(chunk_chars)) if chunk_chars else (text,)
    return [d for d in pieces if d.strip()]


def source_parts(src: Mapping[str, Any] | list, cleaners: list[str] | str | None = None) -> list[SourcePart]:
    """The sources of `src` (a mapping or a list of them, each with an optional own `cleaners`), in order."""
    if isinstance(src, (list, tuple)):
        if not src:
            raise ConfigError("source list is empty")
        return [part for s in src for part in source_parts(s, s.get("cleaners", cleaners))]
    if not isinstance(src, Mapping):
        raise ConfigError(f"data source must be a mapping or a list of them, got {type(src).__name__}")
    names = tuple([] if cleaners is None else [cleaners] if isinstance(cleaners, str) else cleaners)
    get_cleaners(list(names))  # unknown names fail here, before anything is read
    if src.get("kind") == "demo":
        from anchormass.data.demo_corpus import demo_documents

        params = dict(src.get("params") or {})
        texts: Callable[[], Iterator[str]] = lambda: iter(demo_documents(**params))  # noqa: E731
        desc = f"demo corpus (synthetic) {params}"
    else:
        ds, desc = _load(src)
        field = src.get("text_field", "text")
        parts = field.split(".")
        columns = getattr(ds, "column_names", None)
        if columns is not None and parts[0] not in columns:
            raise DataError(f"text field '{field}' not found; columns are {columns}")
        texts = lambda: _texts(ds, parts, field)  # noqa: E731
    if names:
        desc += f" cleaners={list(names)}"
    return [SourcePart(texts, names, int(src["chunk_chars"]) if src.get("chunk_chars") else None,
                       int(src["limit"]) if src.get("limit") else None, desc)]


def _texts(ds, parts: list[str], field: str) -> Iterator[str]:
    """The strings at `field` of every record. A top-level text column is read in Arrow batches
    (several times less CPU than one Python dict per record: the main process of a parallel
    prepare does this reading alone); anything else record by record through `_walk`."""
    import pyarrow as pa

    features = getattr(ds, "features", None)
    column = features.get(parts[0]) if len(parts) == 1 and features else None
    if getattr(column, "dtype", None) in ("string", "large_string"):
        for batch in ds.with_format("arrow").iter(batch_size=256):
            col = batch.column(parts[0])
            if not pa.types.is_string(col.type) and not pa.types.is_large_string(col.type):
                raise DataError(f"text field '{field}' holds {col.type}, not text")
            yield from (t for t in col.to_pylist() if t is not None)
        return
    yield from (text for rec in ds for text in _walk(rec, parts, field))


def describe(parts: list[SourcePart]) -> str:
    return " + ".join(p.desc for p in parts)


def iter_part(part: SourcePart) -> Iterator[str]:
    fns = get_cleaners(list(part.cleaners))
    docs = (d for text in part.texts() for d in documents_of(text, fns, part.chunk_chars))
    return itertools.islice(docs, part.limit) if part.limit else docs


def iter_documents(src: Mapping[str, Any] | list, cleaners: list[str] | str | None = None
                   ) -> tuple[Iterator[str], str]:
    """(documents, description): read, clean (whole documents, so e.g. the Aozora header is seen),
    then cut into chunks and limit. Empty / whitespace-only documents are skipped."""
    parts = source_parts(src, cleaners)
    return itertools.chain.from_iterable(iter_part(p) for p in parts), describe(parts)


def iter_records(src: Mapping[str, Any]) -> tuple[Iterator[Mapping[str, Any]], str]:
    """(rows, description) for record data such as Alpaca instruction sets; kind `demo_chat`
    generates the demo instruction set."""
    if src.get("kind") == "demo_chat":
        from anchormass.data.demo_corpus import demo_instructions

        params = dict(src.get("params") or {})
        return iter(demo_instructions(**params)), f"demo instructions (synthetic) {params}"
    ds, desc = _load(src)
    rows: Iterator[Mapping[str, Any]] = iter(ds)
    if src.get("limit"):
        rows = itertools.islice(rows, int(src["limit"]))
    return rows, desc
