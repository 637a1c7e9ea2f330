"""Exact repeats dropped across a whole corpus before it is split (data.dedup_min_chars).

The held-out split is where evaluation haystacks and perplexity windows come from, so no text of
it may also be a training text. Documents are split train/val one by one, hence a document or a
paragraph that occurs twice in a corpus could land on both sides. Here every paragraph (text
between blank lines, after cleaning) is compared with all earlier ones: a paragraph of at least
`min_chars` characters seen before is dropped (short ones, such as "Note" or "Example:", are kept:
they carry no held-out text), and a document with nothing new left is dropped whole (an exact
duplicate page). What is left has each long paragraph once, so it is on one side of the split.

Cleaning then runs in the reading process, which must see every paragraph in corpus order; the
tokenising workers get clean documents. One `deduplicated(...)` list is one pass: read its parts
once, in order (a second pass builds a new list).
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Callable, Iterator

from anchormass.data.cleaners import get_cleaners
from anchormass.data.sources import SourcePart, documents_of


def _key(paragraph: str) -> bytes:
    return hashlib.blake2b(paragraph.encode("utf-8"), digest_size=16).digest()


def deduplicated(parts: list[SourcePart], min_chars: int) -> list[SourcePart]:
    """`parts` cleaned and chunked as documents_of does, repeats dropped (module docstring)."""
    seen: set[bytes] = set()

    def texts_of(part: SourcePart) -> Callable[[], Iterator[str]]:
        def texts() -> Iterator[str]:
            fns = get_cleaners(list(part.cleaners))
            for raw in part.texts():
                for doc in documents_of(raw, fns, part.chunk_chars):
                    kept, new = [], False
                    for paragraph in doc.split("\n\n"):
                        if not paragraph.strip():
                            continue
                        key = _key(paragraph.strip())
                        if key in seen and len(paragraph.strip()) >= min_chars:
                            continue
                        new |= key not in seen
                        seen.add(key)
                        kept.append(paragraph)
                    if new:
                        yield "\n\n".join(kept)
        return texts

    return [replace(p, texts=texts_of(p), cleaners=(), chunk_chars=None, desc=f"{p.desc} dedup_min_chars={min_chars}")
            for p in parts]
