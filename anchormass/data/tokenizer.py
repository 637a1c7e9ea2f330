"""SentencePiece tokenizer with fixed special ids (docs/method.md §4): NFKC, byte fallback, digits split,
whitespace kept as is (decode(encode(t)) == t for NFKC-normalised t).

Reserved ids, the same for every tokenizer this project trains:
    0 <pad>  1 <unk>  2 <s> (bos)  3 </s> (eos)  4 <|system|>  5 <|user|>  6 <|assistant|>  7 <|end|>
The role markers are user-defined symbols: they are never split and `encode` maps their text
to their id, so the chat template (anchormass.data.sft) can be written as plain text or as ids.
The interface it implements, and the other kind of tokenizer behind it: tokenizer_base.py.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import sys
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import sentencepiece as spm

from anchormass.data.tokenizer_base import TokenizerBase
from anchormass.errors import DataError
from anchormass.utils import atomic_write_bytes

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
ROLE_MARKERS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
MAX_VOCAB = 65_536  # token files are uint16

# SentencePiece drops training sentences longer than this (bytes); long lines are cut first.
_MAX_SENTENCE_BYTES = 8_192


class Tokenizer(TokenizerBase):
    """The project's SentencePiece tokenizer."""

    kind = "sentencepiece"
    file_name = "tokenizer.model"

    def __init__(self, model_bytes: bytes, path: str = "<memory>"):
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(model_bytes)
        except Exception as err:  # sentencepiece raises RuntimeError / OSError on a bad proto
            raise DataError(f"tokenizer {path}: not a SentencePiece model ({type(err).__name__})") from err
        self.path = path
        self.model_bytes = model_bytes
        self.checksum = hashlib.sha256(model_bytes).hexdigest()
        self.vocab_size = self.sp.get_piece_size()
        self.pad_id, self.unk_id = self.sp.pad_id(), self.sp.unk_id()
        self.bos_id, self.eos_id = self.sp.bos_id(), self.sp.eos_id()
        ids = [self.sp.piece_to_id(m) for m in ROLE_MARKERS]
        if (self.pad_id, self.unk_id, self.bos_id, self.eos_id) != (PAD_ID, UNK_ID, BOS_ID, EOS_ID) or any(
            i == self.unk_id for i in ids
        ):
            raise DataError(f"tokenizer {path}: lacks the reserved pad/unk/bos/eos ids or chat-role markers")
        self.system_id, self.user_id, self.assistant_id, self.end_id = ids

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Tokenizer":
        path = Path(path)
        if not path.is_file():
            raise DataError(f"tokenizer not found: {path}")
        return cls(path.read_bytes(), str(path))

    def encode(self, text: str) -> list[int]:
        return self.sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        return self.sp.encode(list(texts), out_type=int, num_threads=num_threads)

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode([int(i) for i in ids])

    def id_to_piece(self, i: int) -> str:
        return self.sp.id_to_piece(int(i))

    def token_id(self, text: str) -> int | None:
        i = self.sp.piece_to_id(text)
        return None if i == self.unk_id and text != self.sp.id_to_piece(i) else i

    def save(self, folder: str | os.PathLike) -> Path:
        return atomic_write_bytes(Path(folder) / self.file_name, self.model_bytes)

    @property
    def role_ids(self) -> dict[str, int]:
        return {"system": self.system_id, "user": self.user_id, "assistant": self.assistant_id, "end": self.end_id}

    def special_ids(self) -> dict[str, int]:
        return {"pad": self.pad_id, "unk": self.unk_id, "bos": self.bos_id, "eos": self.eos_id, **self.role_ids}


def _training_lines(texts: Iterable[str]) -> Iterator[str]:
    """Non-empty lines, long ones cut into pieces SentencePiece will not drop."""
    for text in texts:
        for line in text.split("\n"):
            line = line.strip()
            while line:
                # ~3 bytes per Japanese character: cut by characters with margin.
                yield line[: _MAX_SENTENCE_BYTES // 4]
                line = line[_MAX_SENTENCE_BYTES // 4:]


def train_tokenizer(texts: Iterable[str], out_path: str | os.PathLike, vocab_size: int, *,
                    model_type: str = "unigram", character_coverage: float = 0.9995,
                    max_sentences: int = 2_000_000, seed: int = 42, num_threads: int = 1,
                    hard_vocab_limit: bool = True) -> Tokenizer:
    """Train on `texts` (documents) and write `out_path` atomically. Same texts + settings -> same bytes.

    `hard_vocab_limit=False` lets a small corpus end with fewer pieces than asked (the real size is
    `Tokenizer.vocab_size` and lands in the dataset metadata)."""
    if not 8 + 256 < vocab_size <= MAX_VOCAB:
        raise DataError(f"tokenizer vocab_size must be in (264, {MAX_VOCAB}] (8 reserved + 256 byte pieces), "
                        f"got {vocab_size}")
    # The first max_sentences lines only: bounded memory on large corpora (SentencePiece would
    # sample that many anyway), and reading stops early.
    lines = list(itertools.islice(_training_lines(texts), max_sentences))
    if not lines:
        raise DataError("cannot train a tokenizer on an empty corpus")
    # SentencePiece has no progress bar of its own; say what is about to take a while.
    print(f"training a {model_type} tokenizer (vocab {vocab_size}) on {len(lines)} lines ...", file=sys.stderr)
    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size, model_type=model_type,
            character_coverage=character_coverage, normalization_rule_name="nfkc", byte_fallback=True,
            split_digits=True, remove_extra_whitespaces=False,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            user_defined_symbols=list(ROLE_MARKERS), input_sentence_size=max_sentences,
            shuffle_input_sentence=True, max_sentence_length=_MAX_SENTENCE_BYTES, num_threads=num_threads,
            hard_vocab_limit=hard_vocab_limit, minloglevel=2,
        )
    except RuntimeError as err:  # e.g. "Vocabulary size is too large" for a tiny corpus
        raise DataError(f"tokenizer training failed: {str(err).strip().splitlines()[-1]}") from err
    atomic_write_bytes(out_path, model.getvalue())
    return Tokenizer(model.getvalue(), str(out_path))
