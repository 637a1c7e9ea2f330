"""What the project asks of a tokenizer, whichever library is behind it (docs/method.md §4).

Two kinds exist: the project's own SentencePiece model (tokenizer.py, the default of every
recipe, trained per corpus) and an imported Hugging Face `tokenizers` folder (hf_tokenizer.py,
e.g. SmolLM2's). tokenizer_loader.py picks one by what a path is. Everything downstream (data
preparation, token files, training, the evaluation suites, generation) uses only what is here.

Chat: a tokenizer either has its own chat template (`chat_template`, a Jinja template from the
imported folder, rendered by `apply_chat_template`) or uses the project's template (sft.py), which
needs the role-marker ids of the SentencePiece tokenizer.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Iterable, Mapping, Sequence


class TokenizerBase(ABC):
    kind: str       # "sentencepiece" | "huggingface": what meta.json records
    file_name: str  # its name inside a prepared dataset folder: "tokenizer.model" | "tokenizer"
    path: str       # where it was read from
    checksum: str   # sha256 of what defines it: a checkpoint and every token file record it
    vocab_size: int  # ids are 0 .. vocab_size - 1
    pad_id: int
    unk_id: int
    bos_id: int
    eos_id: int     # after each document in train.bin / val.bin, unless a data config names another
    chat_template: str | None = None  # its own chat template (Jinja); None: the project's (sft.py)

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Ids of `text`, no bos / eos added."""

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """`encode` of each text; `num_threads` > 1 lets the library use that many threads."""
        return [self.encode(t) for t in texts]

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; special tokens are written out, not dropped."""

    @abstractmethod
    def id_to_piece(self, i: int) -> str:
        """The vocabulary entry of id `i` (the library's own spelling of it)."""

    @abstractmethod
    def token_id(self, text: str) -> int | None:
        """The id of a whole vocabulary entry (e.g. a special token), None if there is none."""

    @abstractmethod
    def save(self, folder: str | Path) -> Path:
        """Write this tokenizer into `folder` as `folder / file_name` (atomically); returns that path."""

    def special_ids(self) -> dict[str, int]:
        return {"pad": self.pad_id, "unk": self.unk_id, "bos": self.bos_id, "eos": self.eos_id}

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = False) -> str:
        """The chat as text in this tokenizer's own template (only where `chat_template` is set)."""
        raise NotImplementedError(f"{type(self).__name__} has no chat template of its own (sft.py has the project's)")
