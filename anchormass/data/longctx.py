"""Long-context SFT examples (stage 3a): retrieval questions about facts hidden in long documents.

Example i (deterministic: rng = default_rng([seed, i])) is exactly `length` tokens:

    filler from a token file, with n_facts fact sentences inserted at random depths
    (at sentence ends where possible), then the question about one fact and its answer + eos.

Facts are passkeys ("The passkey is 7305. ...") or key-value pairs ("The value of QX-417 is
8302."); templates are config so a Japanese phrasing is one override. Loss on the answer tokens
and eos (mask 1); with `lm_loss` also on every filler and fact token (the question is never a
target, it is given). Output: the same (tokens, mask, offsets) layout as chat SFT.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from anchormass.data.tokenizer import Tokenizer
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
    templates: dict = field(default_factory=lambda: {
        "passkey": {"fact": "The passkey is {value}. Remember it. {value} is the passkey.",
                    "question": "What is the passkey? The passkey is", "answer": " {value}."},
        "kv": {"fact": "The value of {key} is {value}.",
               "question": "What is the value of {key}? The value of {key} is", "answer": " {value}."},
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
        value = str(rng.integers(1_000, 10_000))  # 4 digits: passkeys as in the passkey suite
        t = spec.templates[kind]
        out.append(tuple(t[part].format(key=key, value=value) for part in ("fact", "question", "answer")))
    return out


def _sentence_ends(tok: Tokenizer) -> np.ndarray:
    """Boolean over the vocab: pieces ending a sentence (inserting after them keeps text readable)."""
    return np.array([tok.id_to_piece(i).rstrip().endswith((".", "。", "!", "?", "！", "？"))
                     for i in range(tok.vocab_size)], dtype=bool)


def _sentence_stop(source: np.ndarray, ends: np.ndarray, n_fill: int, rng: np.random.Generator) -> int:
    """A random end (exclusive) >= n_fill of a filler window, just after a sentence end if one is near."""
    stop = int(rng.integers(n_fill, len(source) + 1))
    back = np.asarray(source[max(n_fill, stop - 256):stop])
    hits = np.nonzero(ends[back])[0]
    return max(n_fill, stop - 256) + int(hits[-1]) + 1 if len(hits) else stop


def build_examples(source: np.ndarray, tok: Tokenizer, spec: LongContextSpec, n_examples: int, seed: int
                   ) -> Iterator[tuple[list[int], list[int]]]:
    """Yield (ids, mask) pairs of exactly spec.length tokens; `source` is a filler token array."""
    ends = _sentence_ends(tok)
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
        facts = _facts(rng, spec)
        fact_ids = [tok.encode(f) for f, _, _ in facts]
        asked = int(rng.integers(len(facts)))
        q_ids = tok.encode(facts[asked][1])
        a_ids = tok.encode(facts[asked][2]) + [tok.eos_id]
        n_fill = spec.length - sum(map(len, fact_ids)) - len(q_ids) - len(a_ids)
        if n_fill < len(facts) or n_fill > len(source):
            raise DataError(f"long-context example of {spec.length} tokens: filler needs {n_fill} tokens, "
                            f"source has {len(source)} (too short, or facts do not fit)")
        # the filler ends at a sentence end (the question must not continue a cut sentence)
        stop = _sentence_stop(source, ends, n_fill, rng)
        filler = np.asarray(source[stop - n_fill:stop], dtype=np.int64)
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
        mask[0] = 0  # the first token is never a target
        yield ids, mask
