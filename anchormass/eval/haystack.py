"""Passkey prompts built in token space (docs/method.md §6 c): exact lengths, controlled needle depth.

A prompt of exactly L tokens is

    [instruction] + filler[:a] + needle(key) + filler[a:F] + question

where F is whatever is left for filler and a = round(depth * F). Filler comes from a token
stream: a fixed sentence group tokenised once and repeated (cut at token level, so any length
is hit exactly), or natural text read from a token file at a seeded offset. Every piece is
tokenised on its own, so the same key and depth give the same tokens whatever the filler.
Trials depend only on (length, depth, seed, phrasing): two models see identical prompts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from anchormass.errors import ConfigError, DataError

CLASSIC_EN = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
# Our own Japanese counterpart: plain, repetitive sentences with no numbers in them.
CLASSIC_JA = ("庭の草は緑色をしている。空はどこまでも青い。お日さまは黄色く光っている。"
              "さあ、出かけよう。行って、また帰ってこよう。")

# The five phrasings of the format-robustness run: (instruction, needle, question).
PHRASINGS: dict[str, dict[str, tuple[str, str, str]]] = {
    "ja": {
        "plain": ("", "パスキーは{key}です。覚えておいてください。{key}がパスキーです。",
                  "パスキーは何ですか？パスキーは"),
        "prefix": ("以下の長い文章の中に大事な情報が一つだけ隠されています。見つけて覚えてください。",
                   "パスキーは{key}です。覚えておいてください。{key}がパスキーです。",
                   "パスキーは何ですか？パスキーは"),
        "paraphrase": ("", "秘密の番号は{key}です。この番号を忘れないでください。",
                       "先ほど出てきた秘密の番号を答えてください。秘密の番号は"),
        "memo": ("", "\n【メモ】パスキー：{key}\n", "\n【質問】メモに書かれたパスキーは？\n【回答】パスキー："),
        "dialogue": ("", "\nA：パスキーを教えて。\nB：パスキーは{key}です。\n",
                     "\nA：さっき聞いたパスキーは何だった？\nB：パスキーは"),
    },
    "en": {
        "plain": ("", "The passkey is {key}. Remember it. {key} is the passkey. ",
                  "Question: What is the passkey? Answer:"),
        "prefix": ("There is an important piece of information hidden inside a lot of irrelevant text. "
                   "Find it and memorize it. ",
                   "The passkey is {key}. Remember it. {key} is the passkey. ",
                   "Question: What is the passkey? Answer:"),
        "paraphrase": ("", "The secret number is {key}. Do not forget this number. ",
                       "Please tell me the secret number mentioned earlier. The secret number is"),
        "memo": ("", "\nMemo: passkey = {key}.\n", "\nWhich passkey does the memo give? The passkey is"),
        "dialogue": ("", "\nA: Tell me the passkey.\nB: The passkey is {key}.\n",
                     "\nA: What was the passkey you told me?\nB: The passkey is"),
    },
}
FILLERS = ("classic_en", "classic_ja", "tokens")


@dataclass(frozen=True)
class Trial:
    length: int
    depth: float
    seed: int
    key: str
    phrasing: str

    def as_dict(self) -> dict:
        return {"length": self.length, "depth": self.depth, "seed": self.seed, "key": self.key,
                "phrasing": self.phrasing}


def make_trial(length: int, depth: float, seed: int, phrasing: str = "plain") -> Trial:
    """The key is a pure function of (length, depth, seed): identical for every model and run."""
    rng = random.Random(f"passkey/{length}/{depth:.4f}/{seed}")
    return Trial(length, float(depth), int(seed), str(rng.randint(1000, 9999)), phrasing)


class Haystack:
    """Builds exact-length prompts for trials. `filler`: classic_en | classic_ja | tokens."""

    def __init__(self, tokenizer, filler: str = "classic_ja", lang: str = "ja",
                 tokens: np.ndarray | None = None, bos: bool = False):
        if filler not in FILLERS:
            raise ConfigError(f"passkey filler must be one of {FILLERS}, got {filler!r}")
        if lang not in PHRASINGS:
            raise ConfigError(f"passkey lang must be one of {sorted(PHRASINGS)}, got {lang!r}")
        if filler == "tokens" and (tokens is None or len(tokens) == 0):
            raise DataError("passkey filler=tokens needs a non-empty token file (filler_path)")
        self.tok = tokenizer
        self.filler = filler
        self.lang = lang
        self.bos = bos
        self._tokens = tokens
        self._unit = None
        if filler != "tokens":
            self._unit = np.asarray(tokenizer.encode(CLASSIC_EN if filler == "classic_en" else CLASSIC_JA))

    def pieces(self, trial: Trial) -> tuple[list[int], list[int], list[int]]:
        if trial.phrasing not in PHRASINGS[self.lang]:
            raise ConfigError(f"unknown passkey phrasing {trial.phrasing!r}; "
                              f"choose from {sorted(PHRASINGS[self.lang])}")
        instr, needle, question = PHRASINGS[self.lang][trial.phrasing]
        head = ([self.tok.bos_id] if self.bos else []) + (self.tok.encode(instr) if instr else [])
        return head, self.tok.encode(needle.format(key=trial.key)), self.tok.encode(question)

    def fixed_tokens(self, trial: Trial) -> int:
        return sum(len(p) for p in self.pieces(trial))

    def _filler(self, n: int, trial: Trial) -> np.ndarray:
        if self._unit is not None:
            reps = -(-n // len(self._unit))
            return np.tile(self._unit, reps)[:n]
        src = self._tokens
        if n > len(src):
            raise DataError(f"passkey filler token file has {len(src)} tokens, a {trial.length}-token "
                            f"prompt needs {n}")
        # Natural text: a window at an offset seeded like the key (same for every model).
        start = random.Random(f"filler/{trial.length}/{trial.seed}").randint(0, len(src) - n)
        return np.asarray(src[start:start + n], dtype=np.int64)

    def build(self, trial: Trial) -> list[int]:
        """Exactly trial.length token ids, needle at round(depth * filler) filler tokens in."""
        head, needle, question = self.pieces(trial)
        n_fill = trial.length - len(head) - len(needle) - len(question)
        if n_fill < 0:
            raise ConfigError(f"passkey length {trial.length} is shorter than the needle and question "
                              f"({trial.length - n_fill} tokens)")
        filler = self._filler(n_fill, trial).tolist()
        at = int(round(trial.depth * n_fill))
        ids = head + filler[:at] + needle + filler[at:] + question
        assert len(ids) == trial.length
        return ids

    def needle_span(self, trial: Trial) -> tuple[int, int]:
        """[start, end) token positions of the needle inside the built prompt."""
        head, needle, question = self.pieces(trial)
        n_fill = trial.length - len(head) - len(needle) - len(question)
        start = len(head) + int(round(trial.depth * n_fill))
        return start, start + len(needle)
