"""An imported Hugging Face tokenizer folder behind the project's interface (tokenizer_base.py).

The folder is what `transformers`' save_pretrained writes (the checkpoint importer writes one
beside the weights, e.g. SmolLM2's):

    tokenizer.json          the whole tokenizer (normaliser, pre-tokeniser, model, added tokens)
    tokenizer_config.json   its special tokens (bos / eos / pad / unk) and, in older folders, the
                            chat template under "chat_template"
    chat_template.jinja     the chat template, where transformers 5 writes it (optional)

Only the `tokenizers` library reads it (no transformers at run time); the chat template is rendered
by chat_template.py. Encoding adds no special tokens, like the SentencePiece tokenizer's. A missing
pad / unk / bos token falls back to eos (GPT-2-style folders name one token for all of them).
The checksum covers the three files, so a changed template is a different tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from anchormass.data.chat_template import render_chat
from anchormass.data.token_file import TOKEN_DTYPE, dtype_capacity
from anchormass.data.tokenizer_base import TokenizerBase
from anchormass.errors import DataError
from anchormass.utils import atomic_write_bytes

TOKENIZER_FILE, CONFIG_FILE, TEMPLATE_FILE = "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"
FILES = (TOKENIZER_FILE, CONFIG_FILE, TEMPLATE_FILE)


def is_hf_folder(path: str | os.PathLike) -> bool:
    return Path(path).is_dir() and (Path(path) / TOKENIZER_FILE).is_file()


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken mapping."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


class HFTokenizer(TokenizerBase):
    kind = "huggingface"
    file_name = "tokenizer"

    def __init__(self, files: Mapping[str, bytes], path: str = "<memory>"):
        from anchormass.extras import require

        require("hf", f"the Hugging Face tokenizer {path}", ["tokenizers"])
        from tokenizers import Tokenizer as Backend

        self.path, self.files = path, {name: files[name] for name in FILES if name in files}
        try:
            self.backend = Backend.from_str(self.files[TOKENIZER_FILE].decode("utf-8"))
        except Exception as err:  # tokenizers raises a plain Exception on a bad file
            raise DataError(f"tokenizer {path}: {TOKENIZER_FILE} is not a `tokenizers` tokenizer "
                            f"({str(err).splitlines()[0][:200] if str(err) else type(err).__name__})") from err
        try:
            config = json.loads(self.files.get(CONFIG_FILE, b"{}").decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise DataError(f"tokenizer {path}: {CONFIG_FILE} is not valid JSON ({err})") from err
        digest = hashlib.sha256()
        for name, data in self.files.items():  # fixed order (FILES); names and sizes delimit the files
            digest.update(f"{name}\0{len(data)}\0".encode() + data)
        self.checksum = digest.hexdigest()
        self.vocab_size = max(self.backend.get_vocab(with_added_tokens=True).values()) + 1
        if self.vocab_size > dtype_capacity(TOKEN_DTYPE):
            raise DataError(f"tokenizer {path}: {self.vocab_size} ids do not fit the {TOKEN_DTYPE} token files "
                            f"(at most {dtype_capacity(TOKEN_DTYPE)})")
        self.special_tokens = {f"{k}_token": _token_text(config.get(f"{k}_token"))
                               for k in ("bos", "eos", "pad", "unk")}
        if not self.special_tokens["eos_token"]:
            raise DataError(f"tokenizer {path}: {CONFIG_FILE} names no eos_token (documents end with it)")
        ids = {}
        for key, text in self.special_tokens.items():
            ids[key] = self.token_id(text or self.special_tokens["eos_token"])
            if ids[key] is None:
                raise DataError(f"tokenizer {path}: its {key} {text!r} is not in its vocabulary")
        self.bos_id, self.eos_id, self.pad_id, self.unk_id = (ids[f"{k}_token"] for k in ("bos", "eos", "pad", "unk"))
        template = self.files.get(TEMPLATE_FILE, b"").decode("utf-8") or config.get("chat_template")
        if template is not None and not isinstance(template, str):
            raise DataError(f"tokenizer {path}: chat_template must be one template (a string); named "
                            f"templates are not supported")
        self.chat_template = template or None

    @classmethod
    def load(cls, folder: str | os.PathLike) -> "HFTokenizer":
        folder = Path(folder)
        if not is_hf_folder(folder):
            raise DataError(f"tokenizer not found: {folder} has no {TOKENIZER_FILE}")
        return cls({name: (folder / name).read_bytes() for name in FILES if (folder / name).is_file()}, str(folder))

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        if num_threads == 1:  # the library's batch call is multi-threaded: one worker, one core
            return [self.encode(t) for t in texts]
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)

    def id_to_piece(self, i: int) -> str:
        return self.backend.id_to_token(int(i)) or ""

    def token_id(self, text: str) -> int | None:
        return self.backend.token_to_id(text)

    def save(self, folder: str | os.PathLike) -> Path:
        out = Path(folder) / self.file_name
        out.mkdir(parents=True, exist_ok=True)
        for name, data in self.files.items():
            atomic_write_bytes(out / name, data)
        return out

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False) -> str:
        if not self.chat_template:
            raise DataError(f"tokenizer {self.path} has no chat template")
        specials = {k: v for k, v in self.special_tokens.items() if v}  # as transformers: only those set
        return render_chat(self.chat_template, messages, add_generation_prompt, specials)
