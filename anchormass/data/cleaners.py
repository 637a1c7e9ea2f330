"""Text cleaners applied to each document before tokenisation, chosen by name in the data config."""

from __future__ import annotations

import re
import unicodedata
from typing import Callable

from anchormass.data.html_text import html_text
from anchormass.errors import ConfigError

# Aozora Bunko markup (https://www.aozora.gr.jp/annotation/): ruby readings 《…》, the ruby-start
# mark ｜, editor notes ［＃…］, a header block between two dashed lines, a footer from 底本：.
_RUBY = re.compile(r"《[^《》]*》")
_NOTE = re.compile(r"※?［＃[^［］]*］")  # ※ marks a character the note describes
_DASHES = re.compile(r"^-{10,}\s*$", re.MULTILINE)
_FOOTER = re.compile(r"^底本[：:]", re.MULTILINE)


def aozora(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    dashes = [m.start() for m in _DASHES.finditer(text)]
    if len(dashes) >= 2:  # title/author lines, then the markup legend between two dashed lines
        title = text[:dashes[0]].strip()
        body_start = text.index("\n", dashes[1]) + 1 if "\n" in text[dashes[1]:] else len(text)
        text = title + "\n\n" + text[body_start:]
    footer = _FOOTER.search(text)
    if footer:
        text = text[:footer.start()]
    text = _RUBY.sub("", text)
    text = _NOTE.sub("", text)
    text = text.replace("｜", "")
    return whitespace(text)


def whitespace(text: str) -> str:
    """Unify line ends, strip line edges (Aozora indents with U+3000), at most one blank line."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = [line.strip(" \t\u3000") for line in text.split("\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def nfkc(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


CLEANERS: dict[str, Callable[[str], str]] = {"aozora": aozora, "whitespace": whitespace, "nfkc": nfkc,
                                             "html": html_text}  # HTML page -> its text (html_text.py)


def get_cleaners(names: list[str] | str | None) -> list[Callable[[str], str]]:
    if names is None:
        return []
    if isinstance(names, str):
        names = [names]
    unknown = [n for n in names if n not in CLEANERS]
    if unknown:
        raise ConfigError(f"unknown cleaner(s) {unknown}; available: {sorted(CLEANERS)}")
    return [CLEANERS[n] for n in names]


def clean(text: str, cleaners: list[Callable[[str], str]]) -> str:
    for fn in cleaners:
        text = fn(text)
    return text
