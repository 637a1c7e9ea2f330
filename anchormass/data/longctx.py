"""Long-context SFT examples (stage 3a): retrieval questions about facts hidden in long documents.

Example i (deterministic: rng = default_rng([seed, i])) is exactly `length` tokens:

    filler from a token file, with n_facts fact sentences inserted at random depths
    (at sentence ends where possible), then the question about one fact and its answer + eos.

Facts are passkeys ("The passkey is 7305. ..."), key-value pairs ("The value of QX-417 is
8302.") or digit codes said twice ("The code is 48213. ... Again, the code is 48213."); templates
are config so a Japanese phrasing is one override. Loss on the answer tokens and eos (mask 1);
with `lm_loss` also on every filler and fact token (the question is never a target, it is given).
With passkeys among the kinds, filler sentences that name a passkey of their own are dropped
from the source first. Two variants for training recall in small models (docs/method.md §6 h):
`episode_len` makes an example a run of short single-fact episodes (an answer every few dozen
tokens), `lm_fraction` makes some examples plain text windows with the loss on every token.
Output: the same (tokens, mask, offsets) layout as chat SFT.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field, replace
from typing import Iterator

import numpy as np

from anchormass.data.demo_corpus import CLASSIC_FILLER
from anchormass.data.tokenizer_base import TokenizerBase
from anchormass.errors import ConfigError, DataError


@dataclass
class LongContextSpec:
    length: int = 2_048  # tokens per example (= training seq_len + 1)
    n_facts: int = 4  # facts inserted per example; one of them is asked about
    kinds: tuple[str, ...] = ("passkey", "kv")
    lm_loss: bool = False
    # A fraction of the examples are MQAR items instead (data/mqar.py; loss on the asked values):
    # many key-value bindings per example where a fact example has one question.
    mqar_fraction: float = 0.0
    mqar: dict = field(default_factory=lambda: {"vocab": None, "n_pairs": 16, "alpha": 1.0})
    # Dense recall SFT: with episode_len = [lo, hi] an example is a run of short single-question
    # episodes (lengths uniform in [lo, hi]) instead of one long one, so every few dozen tokens
    # carry an answer to learn from; classic_filler is the fraction of episodes whose filler is the
    # classic needle-test sentences cut at a random token (as the passkey suite builds its prompts)
    # rather than source text.
    episode_len: tuple[int, int] | None = None
    classic_filler: float = 0.0
    # Pretraining on this layout: a fraction of the examples are plain source windows with the
    # loss on every token (language modelling), the rest recall examples.
    lm_fraction: float = 0.0
    templates: dict = field(default_factory=lambda: {
        "passkey": {"fact": "The passkey is {value}. Remember it. {value} is the passkey.",
                    "question": "What is the passkey? The passkey is", "answer": " {value}."},
        "kv": {"fact": "The value of {key} is {value}.",
               "question": "What is the value of {key}? The value of {key} is", "answer": " {value}."},
        "code": {"fact": "The code is {value}.", "question": "Again,", "answer": "the code is {value}."},
    })

    def __post_init__(self):
        self.kinds = tuple(self.kinds)
        unknown = [k for k in self.kinds if k not in self.templates]
        if unknown or not self.kinds:
            raise ConfigError(f"long-context kinds {list(self.kinds)} need templates; have {sorted(self.templates)}")
        if self.n_facts < 1 or self.length < 64:
            raise ConfigError(f"long-context: need n_facts >= 1 and length >= 64, got {self.n_facts}, {self.length}")
        if self.kinds == ("passkey",) and self.n_facts > 1:
            raise ConfigError("long-context: several passkeys in one example are ambiguous; use n_facts=1")
        if self.episode_len is not None:
            lo, hi = (int(x) for x in self.episode_len)
            if not 48 <= lo <= hi <= self.length:
                raise ConfigError(f"long-context: episode_len must satisfy 48 <= lo <= hi <= length, got {[lo, hi]}")
            self.episode_len = (lo, hi)
        for name in ("classic_filler", "lm_fraction", "mqar_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"long-context: {name} must be in [0, 1], got {getattr(self, name)}")


def _facts(rng: np.random.Generator, spec: LongContextSpec) -> list[tuple[str, str, str]]:
    """[(fact, question, answer)] with distinct keys; at most one passkey per example."""
    out, keys, has_passkey = [], set(), False
    while len(out) < spec.n_facts:
        kind = spec.kinds[rng.integers(len(spec.kinds))]
        if kind == "passkey" and has_passkey:
            kind = next((k for k in spec.kinds if k != "passkey"), None)
            if kind is None:
                break
        letters = "".join(rng.choice(list(string.ascii_uppercase), 2))
        key = f"{letters}-{rng.integers(100, 1000)}"
        if key in keys:
            continue
        keys.add(key)
        has_passkey |= kind == "passkey"
        if kind == "code":  # 4-8 random digits said twice: the plain copy task
            value = "".join(str(d) for d in rng.integers(0, 10, int(rng.integers(4, 9))))
        else:
            value = str(rng.integers(1_000, 10_000))  # 4 digits: passkeys as in the passkey suite
        t = spec.templates[kind]
        out.append(tuple(t[part].format(key=key, value=value) for part in ("fact", "question", "answer")))
    return out


def _sentence_ends(tok: TokenizerBase) -> np.ndarray:
    """Boolean over the vocab: pieces ending a sentence (inserting after them keeps text readable)."""
    return np.array([tok.id_to_piece(i).rstrip().endswith((".", "。", "!", "?", "！", "？"))
                     for i in range(tok.vocab_size)], dtype=bool)


def _sentence_stop(source: np.ndarray, ends: np.ndarray, n_fill: int, rng: np.random.Generator) -> int:
    """A random end (exclusive) >= n_fill of a filler window, just after a sentence end if one is near."""
    stop = int(rng.integers(n_fill, len(source) + 1))
    back = np.asarray(source[max(n_fill, stop - 256):stop])
    hits = np.nonzero(ends[back])[0]
    return max(n_fill, stop - 256) + int(hits[-1]) + 1 if len(hits) else stop


def _fact_example(source: np.ndarray, ends: np.ndarray, tok: TokenizerBase, spec: LongContextSpec, length: int,
                  rng: np.random.Generator, classic: np.ndarray | None = None,
                  stretch: bool = False) -> tuple[list[int], list[int]]:
    """One example of exactly `length` tokens (at least enough for its facts with `stretch`): filler
    with the facts inserted, the question, the answer + eos (mask 1 on the answer; on the document
    too with lm_loss)."""
    facts = _facts(rng, spec)
    fact_ids = [tok.encode(f) for f, _, _ in facts]
    asked = int(rng.integers(len(facts)))
    q_ids = tok.encode(facts[asked][1])
    a_ids = tok.encode(facts[asked][2]) + [tok.eos_id]
    n_fill = length - sum(map(len, fact_ids)) - len(q_ids) - len(a_ids)
    if stretch:  # an episode too short for its fact grows to hold it and one filler token
        n_fill = max(n_fill, len(facts))
    if n_fill < len(facts) or n_fill > len(source):
        raise DataError(f"long-context example of {length} tokens: filler needs {n_fill} tokens, "
                        f"source has {len(source)} (too short, or facts do not fit)")
    # the filler ends at a sentence end (the question must not continue a cut sentence)
    filler = _filler(source, ends, n_fill, rng, classic)
    # depths: uniform in the filler, moved forward to just after a sentence end when one is near
    cuts = []
    for depth in np.sort(rng.random(len(facts))):
        pos = int(depth * n_fill)
        near = np.nonzero(ends[filler[pos:pos + 64]])[0]
        cuts.append(min(n_fill, pos + int(near[0]) + 1) if len(near) else pos)
    ids, mask, prev = [], [], 0
    for cut, f_ids in zip(cuts, fact_ids):
        piece = filler[prev:cut].tolist() + f_ids
        ids += piece
        mask += [int(spec.lm_loss)] * len(piece)
        prev = cut
    ids += filler[prev:].tolist()
    mask += [int(spec.lm_loss)] * (n_fill - prev)
    ids += q_ids + a_ids
    mask += [0] * len(q_ids) + [1] * len(a_ids)
    return ids, mask


def _filler(source: np.ndarray, ends: np.ndarray, n_fill: int, rng: np.random.Generator,
            classic: np.ndarray | None = None) -> np.ndarray:
    """n_fill filler tokens: the `classic` sentences tiled and cut at a random token, or a source
    window ending at a sentence end."""
    if classic is not None:
        off = int(rng.integers(len(classic)))
        return np.tile(classic, -(-(n_fill + off) // len(classic)))[off:off + n_fill]
    stop = _sentence_stop(source, ends, n_fill, rng)
    return np.asarray(source[stop - n_fill:stop], dtype=np.int64)


def without_sentences_naming(source: np.ndarray, ends: np.ndarray, token: int) -> np.ndarray:
    """`source` less every sentence that contains `token`: filler for passkey questions must not
    state a passkey of its own (the demo corpus states many), or the question has two answers."""
    source = np.asarray(source)
    sentence = np.concatenate([[0], np.cumsum(ends[source])[:-1]])  # sentence number of each token
    named = np.unique(sentence[source == token])
    return source[~np.isin(sentence, named)]


def _episodes(source: np.ndarray, ends: np.ndarray, tok: TokenizerBase, spec: LongContextSpec, one: LongContextSpec,
              classic: np.ndarray, rng: np.random.Generator) -> tuple[list[int], list[int]]:
    """Short single-fact episodes (`one`: spec with n_facts=1) back to back up to spec.length tokens
    (the last one cut); `classic` is the tokenised classic filler."""
    lo, hi = spec.episode_len
    ids: list[int] = []
    mask: list[int] = []
    while len(ids) < spec.length:
        use_classic = classic if rng.random() < spec.classic_filler else None
        e_ids, e_mask = _fact_example(source, ends, tok, one, int(rng.integers(lo, hi + 1)), rng, use_classic,
                                      stretch=True)
        ids += e_ids
        mask += e_mask
    return ids[:spec.length], mask[:spec.length]


def build_examples(source: np.ndarray, tok: TokenizerBase, spec: LongContextSpec, n_examples: int, seed: int
                   ) -> Iterator[tuple[list[int], list[int]]]:
    """Yield (ids, mask) pairs of exactly spec.length tokens; `source` is a filler token array."""
    ends = _sentence_ends(tok)
    if "passkey" in spec.kinds:
        source = without_sentences_naming(source, ends, tok.encode("passkey")[-1])
    if spec.episode_len is not None:  # built once, not per example
        one = replace(spec, n_facts=1)
        classic = np.asarray(tok.encode(CLASSIC_FILLER[0] + " "), dtype=np.int64)
    vocab = None
    if spec.mqar_fraction > 0:
        from anchormass.data.mqar import MQARVocab, training_example

        vocab = MQARVocab.from_config(spec.mqar.get("vocab") or {})
        vocab.check_fits(tok.vocab_size)
    for i in range(n_examples):
        rng = np.random.default_rng([seed, i])
        if vocab is not None and rng.random() < spec.mqar_fraction:
            n_pairs = int(spec.mqar.get("n_pairs", 16))
            ids, mask = training_example(vocab, spec.length, n_pairs, n_pairs, seed, i,
                                         float(spec.mqar.get("alpha", 1.0)))
            yield [int(t) for t in ids], [int(m) for m in mask]
            continue
        if spec.lm_fraction and rng.random() < spec.lm_fraction:
            start = int(rng.integers(0, len(source) - spec.length + 1))
            ids = [int(t) for t in source[start:start + spec.length]]
            yield ids, [0] + [1] * (spec.length - 1)
            continue
        if spec.episode_len is None:
            ids, mask = _fact_example(source, ends, tok, spec, spec.length, rng)
        else:
            ids, mask = _episodes(source, ends, tok, spec, one, classic, rng)
        mask[0] = 0  # the first token is never a target
        yield ids, mask
