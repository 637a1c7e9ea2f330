"""What the suites ask a model: passkey prompts, trials and the scoring of an answer, and the
perplexity items (docs/method.md §6 b, c).

Passkey (passkey, policies, baselines, recall_frontier, retrofit). A prompt of exactly L tokens is
built in token space,

    [instruction] + filler[:a] + needle(key) + filler[a:F] + question

where F is whatever is left for filler and a = round(depth * F), moved by less than one 64-token
block so that the needle's start falls on a different offset inside its compression block in every
trial of a length (`align`, a seeded permutation of the offsets: otherwise every trial at one depth
would test the same position relative to the block boundary, docs/method.md §2.3). Filler comes from a token
stream: a fixed sentence group tokenised once and repeated (cut at token level, so any length
is hit exactly), or natural text read from a token file at a seeded offset. Every piece is
tokenised on its own, so the same key and depth give the same tokens whatever the filler.
Trials depend only on (length, depth, seed, phrasing): two models see identical prompts. A
trial is decoded greedily and scored on the first digit run of its NFKC text.

Perplexity (ppl, baselines): the token file a config names, its contexts and target length,
and the fixed anchors (drawn once, deterministically, or pinned with `anchors: [...]`).
"""

from __future__ import annotations

import random
import re
import unicodedata
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from anchormass.errors import ConfigError, DataError
from anchormass.eval.scoring import OOM, free_memory, is_oom, progress
from anchormass.eval.suite import EvalContext, EvalModel, Suite
from anchormass.inference.generate import generate

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
        # The layout of the passkey test as long-context papers run it on pretrained models: an
        # instruction first, and a question the model completes with the key itself.
        "completion": ("There is an important piece of information hidden inside a lot of irrelevant text. "
                       "Find it and memorize it. I will ask you about it. ",
                       "The pass key is {key}. Remember it. {key} is the pass key. ",
                       "What is the pass key? The pass key is"),
    },
}
FILLERS = ("classic_en", "classic_ja", "tokens")


ALIGN_BLOCK = 64  # the compression block C of docs/method.md §2.3: the period of a needle's alignment


@dataclass(frozen=True)
class Trial:
    length: int
    depth: float
    seed: int
    key: str
    phrasing: str
    align: int | None = None  # the needle's start position mod ALIGN_BLOCK (None: exactly at the depth)

    def as_dict(self) -> dict:
        return {"length": self.length, "depth": self.depth, "seed": self.seed, "key": self.key,
                "phrasing": self.phrasing, "align": self.align}


def make_trial(length: int, depth: float, seed: int, phrasing: str = "plain") -> Trial:
    """The key is a pure function of (length, depth, seed): identical for every model and run."""
    rng = random.Random(f"passkey/{length}/{depth:.4f}/{seed}")
    return Trial(length, float(depth), int(seed), str(rng.randint(1000, 9999)), phrasing)


class Haystack:
    """Builds exact-length prompts for trials. `filler`: classic_en | classic_ja | tokens."""

    def __init__(self, tokenizer, filler: str = "classic_ja", lang: str = "ja",
                 tokens: np.ndarray | None = None, bos: bool = False, chat: bool = False):
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
        # An instruction-tuned model is asked in its own chat template: the whole prompt is the user's
        # turn and the answer starts the assistant's (a raw prompt gets an end-of-turn from it).
        self._frame = chat_frame(tokenizer) if chat else ("", "")
        self._tokens = tokens
        self._unit = None
        if filler != "tokens":
            self._unit = np.asarray(tokenizer.encode(CLASSIC_EN if filler == "classic_en" else CLASSIC_JA))

    def pieces(self, trial: Trial) -> tuple[list[int], list[int], list[int]]:
        if trial.phrasing not in PHRASINGS[self.lang]:
            raise ConfigError(f"unknown passkey phrasing {trial.phrasing!r}; "
                              f"choose from {sorted(PHRASINGS[self.lang])}")
        instr, needle, question = PHRASINGS[self.lang][trial.phrasing]
        before, after = (self.tok.encode(part) if part else [] for part in self._frame)
        head = ([self.tok.bos_id] if self.bos else []) + before + (self.tok.encode(instr) if instr else [])
        return head, self.tok.encode(needle.format(key=trial.key)), self.tok.encode(question) + after

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

    def _layout(self, trial: Trial) -> tuple[list[int], list[int], list[int], int, int]:
        """(head, needle, question, filler tokens F, filler tokens before the needle)."""
        head, needle, question = self.pieces(trial)
        n_fill = trial.length - len(head) - len(needle) - len(question)
        if n_fill < 0:
            raise ConfigError(f"passkey length {trial.length} is shorter than the needle and question "
                              f"({trial.length - n_fill} tokens)")
        at = int(round(trial.depth * n_fill))
        if trial.align is not None:
            # Forward to the next start with the trial's offset in its block; back one block at the end.
            at += (trial.align - (len(head) + at)) % ALIGN_BLOCK
            if at > n_fill:
                at = at - ALIGN_BLOCK if at >= ALIGN_BLOCK else int(round(trial.depth * n_fill))
        return head, needle, question, n_fill, at

    def build(self, trial: Trial) -> list[int]:
        """Exactly trial.length token ids, the needle after about depth * F filler tokens (see `_layout`)."""
        head, needle, question, n_fill, at = self._layout(trial)
        filler = self._filler(n_fill, trial).tolist()
        ids = head + filler[:at] + needle + filler[at:] + question
        assert len(ids) == trial.length
        return ids

    def needle_span(self, trial: Trial) -> tuple[int, int]:
        """[start, end) token positions of the needle inside the built prompt."""
        head, needle, _, _, at = self._layout(trial)
        return len(head) + at, len(head) + at + len(needle)


def chat_frame(tokenizer) -> tuple[str, str]:
    """The text of the tokenizer's chat template before and after one user message, with the
    assistant's turn opened after it."""
    mark = "\x00prompt\x00"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": mark}], add_generation_prompt=True)
    except (NotImplementedError, DataError) as err:
        raise ConfigError(f"passkey chat=true needs a tokenizer with a chat template: {err}") from None
    before, _, after = text.partition(mark)
    return before, after


# Scoring an answer: NFKC, first digit run, exact / digits matched.

_DIGITS = re.compile(r"[0-9]+")


def first_digit_run(text: str) -> str | None:
    """NFKC first (full-width ４２ -> 42), then the first run of ASCII digits, if any."""
    match = _DIGITS.search(unicodedata.normalize("NFKC", text))
    return match.group(0) if match else None


def score_answer(text: str, key: str) -> dict:
    """exact: the first digit run equals the key; digits: position-wise matches of its first
    len(key) digits with the key (0..4 for a 4-digit key)."""
    run = first_digit_run(text)
    if run is None:
        return {"answer": None, "exact": False, "digits": 0}
    digits = sum(a == b for a, b in zip(run[: len(key)], key))
    return {"answer": run, "exact": run == key, "digits": int(digits)}


# Trials: the haystack a config asks for, the (length, depth, seed) grid, greedy decoding, the tally.

DEFAULT_DEPTHS = [0.1, 0.3, 0.5, 0.7, 0.9]


def build_haystack(suite: Suite, ctx: EvalContext) -> Haystack:
    """The haystack a passkey-style suite's config asks for (filler, language, token file)."""
    tokens = None
    if suite.opt("filler", "classic_ja") == "tokens":
        from anchormass.data.token_file import open_tokens

        path = suite.opt("filler_path") or (ctx.data_dir / "val.bin" if ctx.data_dir else None)
        if not path:
            raise ConfigError(f"{suite.name}: filler=tokens needs filler_path=<token file> or data_dir")
        tokens = open_tokens(Path(str(path)).expanduser(), tokenizer_checksum=getattr(ctx.tokenizer, "checksum", None))
        ctx.record_data(f"{suite.name}_filler", path)
    return Haystack(ctx.tokenizer, filler=suite.opt("filler", "classic_ja"), lang=suite.opt("lang", "ja"),
                    tokens=tokens, bos=bool(suite.opt("bos", False)), chat=bool(suite.opt("chat", False)))


def run_trials(ctx: EvalContext, m: EvalModel, hay: Haystack, trials: list[Trial], *, max_new_tokens: int,
               batch_size: int, policy=None, budget=None, chunk=None, desc: str = "passkey") -> list[dict]:
    """One record per trial: the trial, the decoded output, exact / digits (or status OOM).
    Trials are batched by length (a batch shares one length, as the cache requires)."""
    by_len: dict[int, list[Trial]] = {}
    for t in trials:
        by_len.setdefault(t.length, []).append(t)
    batches = [ts[i:i + batch_size] for ts in by_len.values() for i in range(0, len(ts), batch_size)]
    records: list[dict] = []
    for batch in progress(batches, ctx.progress, f"{desc} [{m.label}]"):
        ids = torch.tensor([hay.build(t) for t in batch], dtype=torch.long, device=ctx.device)
        try:
            new = generate(m.model, ids, max_new_tokens, temperature=0.0, policy=policy, budget=budget,
                           chunk_size=None if chunk is None else int(chunk)).tolist()
        except Exception as err:  # OOM at a length is a result
            if not is_oom(err):
                raise
            free_memory(ctx.device)
            records += [{**t.as_dict(), "model": m.label, "status": OOM, "exact": False, "digits": 0} for t in batch]
            continue
        vocab = ctx.tokenizer.vocab_size
        for t, out in zip(batch, new):
            # a model may emit ids the tokenizer lacks (model vocab > tokenizer vocab): read as unk
            text = ctx.tokenizer.decode([i if i < vocab else ctx.tokenizer.unk_id for i in out])
            records.append({**t.as_dict(), "model": m.label, "status": "ok", "output": text,
                            **score_answer(text, t.key)})
    return records


def trial_grid(lengths, depths, seeds, phrasing: str = "plain", jitter: bool = True) -> list[Trial]:
    """Every (length, depth, seed) trial. With `jitter`, the trials of one length get distinct needle
    offsets inside the 64-token block (a permutation seeded by the length; they repeat only past 64
    trials), so a depth grid does not test one block position over and over."""
    trials = []
    for L in lengths:
        grid = [make_trial(int(L), float(d), int(s), phrasing) for d in depths for s in seeds]
        offsets = random.Random(f"align/{int(L)}").sample(range(ALIGN_BLOCK), ALIGN_BLOCK)
        trials += [replace(t, align=offsets[i % ALIGN_BLOCK]) if jitter else t for i, t in enumerate(grid)]
    return trials


def passkey_setup(owner: str, cfg: dict, ctx: EvalContext, lengths) -> tuple[Haystack, list[Trial], int]:
    """The passkey trials another suite borrows (baselines, recall_frontier): the passkey suite's haystack
    options from `cfg` (filler, lang, filler_path, bos), the (length, depth, seed) grid and the number
    of tokens to decode. Every prompt is built once here, so a too-short length fails before any run."""
    options = Suite(dict(cfg))
    options.name = owner
    hay = build_haystack(options, ctx)
    trials = trial_grid(lengths, cfg.get("depths", DEFAULT_DEPTHS), cfg.get("seeds", [0, 1, 2]),
                        cfg.get("phrasing", "plain"), jitter=bool(cfg.get("jitter", True)))
    for t in trials:
        ctx.check_length(owner, t.length)
        hay.build(t)
    return hay, trials, int(cfg.get("new_tokens", 8))


def tally(records: list[dict]) -> dict:
    n = len(records)
    return {"n": n, "exact": sum(r["exact"] for r in records),
            "digits_mean": float(np.mean([r["digits"] for r in records])) if n else 0.0,
            "oom": sum(r["status"] == OOM for r in records)}


# Perplexity items.

@dataclass
class PplItems:
    tokens: Any  # the token file's ids (a memmap)
    anchors: list[int]
    contexts: list[int]
    target_len: int


def draw_anchors(n_tokens: int, lo: int, target_len: int, n: int, seed: int) -> list[int]:
    """n anchors in [lo, n_tokens - target_len], one per equal stratum: deterministic, spread out."""
    hi = n_tokens - target_len  # inclusive
    if hi - lo + 1 < n:
        raise DataError(f"ppl: token file has {n_tokens} tokens; {n} anchors need contexts of {lo} plus "
                        f"{target_len} targets each (at least {lo + target_len + n - 1} tokens)")
    rng = np.random.default_rng(seed)
    edges = np.linspace(lo, hi + 1, n + 1).astype(np.int64)
    return [int(rng.integers(edges[i], max(edges[i] + 1, edges[i + 1]))) for i in range(n)]


def data_path(cfg: dict, ctx: EvalContext) -> Path:
    """`data=` of the ppl config, else val.bin in the run's data_dir."""
    if cfg.get("data"):
        return Path(str(cfg.get("data"))).expanduser()
    if ctx.data_dir is not None:
        return Path(ctx.data_dir) / "val.bin"
    raise ConfigError("ppl needs a token file: eval.ppl.data=<val.bin> or data_dir=<folder>")


def ppl_items(cfg: dict, ctx: EvalContext) -> PplItems:
    """The ppl config's items, every input checked (lengths, vocab, tokenizer checksum, anchors)
    and the token file recorded, before anything runs."""
    from anchormass.data.token_file import open_tokens, read_sidecar

    contexts = [int(c) for c in cfg.get("contexts", [0, 1024, 3072, 7168, 15360, 31744])]
    target_len = int(cfg.get("target_len", 1024))
    if target_len < 2 or any(c < 0 for c in contexts) or not contexts:
        raise ConfigError("ppl: target_len must be >= 2 and contexts non-empty and >= 0")
    if cfg.get("mode", "parallel") not in ("parallel", "cached"):
        raise ConfigError(f"ppl.mode must be parallel or cached, got {cfg.get('mode')!r}")
    for c in contexts:
        ctx.check_length("ppl", c + target_len)
    path = data_path(cfg, ctx)
    meta = read_sidecar(path)
    for m in ctx.models:
        if int(meta["vocab_size"]) > m.config.vocab_size:
            raise DataError(f"ppl: {path.name} has vocab {meta['vocab_size']} but model '{m.label}' only "
                            f"{m.config.vocab_size}: data and checkpoint do not match")
    want = getattr(ctx.tokenizer, "checksum", None)
    tokens = open_tokens(path, tokenizer_checksum=want if meta.get("tokenizer_checksum") else None)
    ctx.record_data("ppl", path)
    lo = max(contexts)
    if cfg.get("anchors"):
        anchors = [int(a) for a in cfg.get("anchors")]
        bad = [a for a in anchors if a < lo or a + target_len > len(tokens)]
        if bad:
            raise DataError(f"ppl: anchors {bad} fall outside [{lo}, {len(tokens) - target_len}]")
    else:
        anchors = draw_anchors(len(tokens), lo, target_len, int(cfg.get("n_anchors", 10)),
                               int(cfg.get("anchor_seed", 0)))
    return PplItems(tokens=tokens, anchors=anchors, contexts=contexts, target_len=target_len)
