"""HTML pages -> plain text paragraphs (the `html` cleaner, cleaners.py).

What a reader of the page sees as its content: where the page marks its main part
(`role="main"`, as Sphinx and most documentation generators do), only that part; navigation,
scripts, styles, forms, tables of contents (class "toc") and Sphinx's permalink marks ("¶")
never. Block elements (paragraphs, headings, list items, table rows, code blocks) become
paragraphs separated by one blank line; inside a paragraph runs of whitespace become one space,
except in <pre>, whose lines are kept.
Character references are decoded by the parser. Only the standard library: no parser dependency.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

# Elements whose text is never content.
_SKIP = {"head", "script", "style", "nav", "form", "svg", "noscript", "button", "select", "template"}
_SKIP_CLASSES = {"headerlink", "toc"}  # Sphinx's "¶" permalink after every heading; a table of contents
# Elements that start and end a paragraph.
_BLOCKS = {"p", "div", "section", "article", "main", "header", "footer", "aside", "h1", "h2", "h3", "h4", "h5",
           "h6", "li", "dt", "dd", "ul", "ol", "dl", "pre", "blockquote", "table", "tr", "caption", "figure",
           "figcaption", "hr", "address", "details", "summary"}
# Elements with no end tag: never counted as open.
_VOID = {"br", "hr", "img", "meta", "link", "input", "area", "base", "col", "embed", "source", "track", "wbr"}
_BREAK = "\x00"  # a paragraph break, resolved when the text is assembled


class _PageText(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.whole: list[str] = []  # everything outside skipped elements
        self.main: list[str] | None = None  # inside the first role="main" element, once seen
        self._skip: list[tuple[str, int]] = []  # (tag, nesting) of the skipped element we are in
        self._main_tag: tuple[str, int] | None = None  # (tag, nesting) while inside the main element
        self._main_done = False
        self._pre = 0

    def _out(self) -> list[str]:
        return self.main if self._main_tag is not None else self.whole

    def _emit(self, piece: str) -> None:
        self._out().append(piece)
        if self._main_tag is not None:
            self.whole.append(piece)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _VOID:
            if not self._skip:
                self._emit(_BREAK if tag == "hr" else "\n" if tag == "br" else "")
            return
        if self._skip:
            name, depth = self._skip[-1]
            if tag == name:
                self._skip[-1] = (name, depth + 1)
            return
        attr = dict(attrs)
        classes = set((attr.get("class") or "").split())
        if tag in _SKIP or classes & _SKIP_CLASSES or attr.get("role") in ("navigation", "search"):
            self._skip.append((tag, 1))
            return
        if self._main_tag is not None and tag == self._main_tag[0]:
            self._main_tag = (tag, self._main_tag[1] + 1)
        elif self._main_tag is None and not self._main_done and attr.get("role") == "main":
            self._main_tag, self.main = (tag, 1), []
        if tag == "pre":
            self._pre += 1
        if tag in _BLOCKS:
            self._emit(_BREAK)

    def handle_endtag(self, tag: str) -> None:
        if self._skip:
            name, depth = self._skip[-1]
            if tag == name:
                self._skip[-1] = (name, depth - 1)
                if depth == 1:
                    self._skip.pop()
            return
        if tag in _BLOCKS:
            self._emit(_BREAK)
        if tag == "pre" and self._pre:
            self._pre -= 1
        if self._main_tag is not None and tag == self._main_tag[0]:
            depth = self._main_tag[1] - 1
            self._main_tag = (tag, depth) if depth else None
            self._main_done = not depth

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self._emit(data if self._pre else re.sub(r"\s+", " ", data))


def html_text(page: str) -> str:
    """The content of an HTML page as paragraphs separated by blank lines (see the module docstring)."""
    parser = _PageText()
    parser.feed(page)
    parser.close()
    pieces = parser.main if parser.main and "".join(parser.main).strip() else parser.whole
    paragraphs = []
    for para in "".join(pieces).split(_BREAK):
        lines = [line.rstrip() for line in para.strip("\n").split("\n")]
        if any(line.strip() for line in lines):
            # a code block keeps its indentation; prose lines lose the spaces left by the markup
            text = "\n".join(lines) if "\n" in para.strip("\n") else para.strip()
            paragraphs.append(text)
    return "\n\n".join(paragraphs)
