"""A Hugging Face chat template (Jinja) rendered the way `transformers`' apply_chat_template renders
it, without importing transformers: a sandboxed environment (a template from a downloaded folder
is data, and the sandbox keeps it from reaching Python objects), blocks trimmed, loop controls,
`raise_exception`, and a `tojson` that keeps non-ASCII text. tests/test_data_hf_tokenizer.py
compares the result with transformers' own on the same messages.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Mapping, Sequence

from anchormass.errors import DataError


def _raise(message: str) -> None:
    raise DataError(f"chat template: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def _compiled(template: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    return env.from_string(template)


def render_chat(template: str, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool,
                special_tokens: Mapping[str, str]) -> str:
    """`messages` ({"role", "content"} each) as text; `special_tokens` are the template's
    variables bos_token, eos_token, ... (as transformers passes them)."""
    from jinja2 import TemplateError

    try:
        return _compiled(template).render(messages=[dict(m) for m in messages],
                                          add_generation_prompt=add_generation_prompt, **special_tokens)
    except TemplateError as err:
        raise DataError(f"chat template cannot be rendered: {type(err).__name__}: {err}") from err
