"""A tiny SentencePiece tokenizer that covers the English passkey prompts (filler, phrasings, digits)."""

from pathlib import Path


def passkey_tokenizer(folder: Path):
    from anchormass.data.tokenizer import train_tokenizer
    from anchormass.eval.items import CLASSIC_EN, PHRASINGS

    texts = [CLASSIC_EN * 3] + [" ".join(v) for v in PHRASINGS["en"].values()] + ["0123456789 passkey"] * 3
    return train_tokenizer(texts, folder / "tok.model", vocab_size=400, hard_vocab_limit=False)
