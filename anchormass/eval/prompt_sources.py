"""Prompts of exact lengths for the cache studies (SnapKV hit rate): passkey haystacks, windows
of a token file at seeded offsets, or seeded random ids (random-init demos)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from anchormass.errors import ConfigError
from anchormass.eval.suite import EvalContext


@dataclass
class PromptSource:
    """Prompts of exact lengths: passkey haystacks (needs a tokenizer), windows of a token file
    at seeded offsets, or seeded random ids (random-init demos)."""

    kind: str  # "passkey" | "tokens" | "random"
    haystack: object | None = None
    tokens: object | None = None  # np.memmap for kind="tokens"
    where: str = ""

    def prompt(self, length: int, seed: int, vocab: int) -> torch.Tensor:
        if self.kind == "passkey":
            from anchormass.eval.haystack import make_trial

            depth = (0.1, 0.3, 0.5, 0.7, 0.9)[seed % 5]
            return torch.tensor(self.haystack.build(make_trial(length, depth, seed)), dtype=torch.long)
        gen = torch.Generator().manual_seed(seed)
        if self.kind == "tokens":
            if length > len(self.tokens):
                raise ConfigError(f"a {length}-token prompt does not fit in {self.where} ({len(self.tokens)} tokens)")
            start = int(torch.randint(0, len(self.tokens) - length + 1, (1,), generator=gen))
            return torch.as_tensor(np.asarray(self.tokens[start:start + length], dtype=np.int64))
        return torch.randint(0, vocab, (length,), generator=gen)

    def describe(self) -> str:
        return {"passkey": "passkey haystacks (depths 10-90%)", "random": "random token ids (seeded)",
                "tokens": f"windows of {self.where} at seeded offsets"}[self.kind]


def prompt_source(kind: str | None, ctx: EvalContext, suite: str, data: str | None = None) -> PromptSource:
    """kind None: passkey when a tokenizer is loaded, else random ids. kind "tokens" reads `data`
    (a .bin token file) or `<data_dir>/val.bin`."""
    kind = kind or ("passkey" if ctx.tokenizer is not None else "random")
    if kind == "random":
        return PromptSource("random")
    if kind == "passkey":
        from anchormass.eval.haystack import Haystack

        return PromptSource("passkey", Haystack(ctx.need_tokenizer(suite)))
    if kind == "tokens":
        from anchormass.data.token_file import open_tokens

        if data is None and ctx.data_dir is None:
            raise ConfigError(f"{suite}: prompts=tokens needs eval.{suite}.data=<val.bin> or data_dir=<folder>")
        path = Path(str(data)).expanduser() if data else Path(ctx.data_dir) / "val.bin"
        tokens = open_tokens(path)
        if ctx.record_data is not None:
            ctx.record_data(suite, path)
        return PromptSource("tokens", tokens=tokens, where=path.name)
    raise ConfigError(f"{suite}: prompts must be 'passkey', 'tokens' or 'random', got {kind!r}")
