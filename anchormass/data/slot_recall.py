"""The slot-recall ladder (docs/method.md §6 i): recall tasks whose answers lie beyond the local window.

Three tasks in token space, one ladder of how much a compressed slot has to carry:

- `kv` (a): MQAR-style single-token key -> single-token value pairs in noise; the query region
  asks every pair's key and the value is the answer (one token, one copy: it reaches a global
  head only if stage 1 keeps it as an outlier or an anchor, or if lower layers wrote it into
  its neighbours);
- `span` (b): the same pairs with the key and the value each said `span` times in a row, so a
  group of G copies averages to the copy itself: the easiest case for slots, a check that the
  slot path trains at all;
- `passkey` (c): the passkey suite's 4-digit key (1000-9999, each digit one token) in its layout
  (docs/method.md §6 c): a needle phrase that says the key twice (`<is> KEY <remember> KEY <end>`),
  filler, then a question phrase and the key as the answer. Token space: phrase and filler tokens
  are ids of their own ranges, not text, so every model of the study shares one small vocabulary.

Every answer token of the needle lies at least `min_distance` (default 64 = the window) positions
before the first position whose prediction is scored, and every needle starts at or after `start`
(default 16 = the sinks), so on AnchorMass the answer reaches a query only through slots. Token ids
come from disjoint ranges (template, digits, keys, values, noise). An item is a pure function of
(task, split, seed, length, index, task settings): the `train`, `val` and `eval` splits are
separate random streams, so held-out items are never trained on (`assert_disjoint` checks it).

`prepare_slot_recall` writes a prepared SFT folder (train/val tokens + loss mask on the answers
only + offsets, anchormass/data/dataset_dir.py) that SFTDataModule reads as it reads chat SFT.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np

from anchormass.errors import ConfigError

TASKS = ("kv", "span", "passkey")
SPLITS = {"train": 0, "val": 1, "eval": 2}
_STREAM_TAG = 0x736C6F74  # "slot": no other generator's stream coincides with these
# Task (c)'s phrases as offsets into the template range: needle = IS key REMEMBER(3) key END(2),
# question = WHAT(4) IS; the answer (the key) follows the question.
_IS, _REMEMBER, _END, _WHAT = (0, 1), (2, 3, 4), (5, 6), (7, 8, 9, 10)
KEY_DIGITS = 4


@dataclass(frozen=True)
class SlotRecallVocab:
    """Half-open id ranges [lo, hi): non-empty, disjoint, digits exactly 10 ids, template >= 11."""

    template: tuple[int, int] = (8, 24)
    digits: tuple[int, int] = (24, 34)
    keys: tuple[int, int] = (64, 80)
    values: tuple[int, int] = (128, 144)
    noise: tuple[int, int] = (192, 512)

    NAMES = ("template", "digits", "keys", "values", "noise")

    def __post_init__(self):
        for name in self.NAMES:
            r = getattr(self, name)
            if len(r) != 2 or int(r[0]) < 0 or int(r[1]) <= int(r[0]):
                raise ConfigError(f"slot_recall: vocab.{name} must be [lo, hi] with 0 <= lo < hi, got {list(r)}")
            object.__setattr__(self, name, (int(r[0]), int(r[1])))
        for i, a in enumerate(self.NAMES):
            for b in self.NAMES[i + 1:]:
                (alo, ahi), (blo, bhi) = getattr(self, a), getattr(self, b)
                if alo < bhi and blo < ahi:
                    raise ConfigError(f"slot_recall: vocab.{a} [{alo}, {ahi}) and vocab.{b} [{blo}, {bhi}) overlap")
        if self.digits[1] - self.digits[0] != 10:
            raise ConfigError(f"slot_recall: vocab.digits must hold exactly 10 ids, got {list(self.digits)}")
        if self.template[1] - self.template[0] < 11:
            raise ConfigError(f"slot_recall: vocab.template needs at least 11 ids, got {list(self.template)}")

    @classmethod
    def from_config(cls, mapping: Mapping | None) -> "SlotRecallVocab":
        mapping = dict(mapping or {})
        unknown = set(mapping) - set(cls.NAMES)
        if unknown:
            raise ConfigError(f"slot_recall: unknown vocab field(s) {', '.join(sorted(unknown))}")
        return cls(**{k: tuple(v) for k, v in mapping.items()})

    @property
    def max_id(self) -> int:
        return max(getattr(self, n)[1] for n in self.NAMES) - 1

    def check_fits(self, vocab_size: int, who: str = "the model") -> None:
        if self.max_id >= vocab_size:
            raise ConfigError(f"slot_recall: token ids up to {self.max_id} need a vocabulary of at least "
                              f"{self.max_id + 1}; {who} has {vocab_size}")

    def as_dict(self) -> dict:
        return {n: list(getattr(self, n)) for n in self.NAMES}


@dataclass(frozen=True)
class TaskSpec:
    """What one item of a task looks like (shared by the training data and the suite)."""

    task: str
    length: int  # tokens per item, answers included
    n_pairs: int = 4  # kv / span: facts per item, every one asked
    span: int = 16  # span: copies of the key and of the value
    min_distance: int = 64  # answer -> first scored position
    start: int = 16  # no needle token before this position (the sinks)

    def __post_init__(self):
        if self.task not in TASKS:
            raise ConfigError(f"slot_recall: task must be one of {', '.join(TASKS)}, got {self.task!r}")
        for key in ("length", "n_pairs", "span", "min_distance"):
            if int(getattr(self, key)) < 1:
                raise ConfigError(f"slot_recall: {key} must be >= 1, got {getattr(self, key)}")
        if int(self.start) < 0:
            raise ConfigError(f"slot_recall: start must be >= 0, got {self.start}")
        room = self.context_len - self.min_distance + 1 - self.start  # where needles may lie
        if room < self.n_facts * self.fact_width:
            raise ConfigError(f"slot_recall: a {self.task} item of {self.length} tokens has no room for "
                              f"{self.n_facts} fact(s) of {self.fact_width} tokens at least {self.min_distance} "
                              f"tokens before its queries and after position {self.start}; lengthen it")

    @property
    def n_facts(self) -> int:
        return 1 if self.task == "passkey" else int(self.n_pairs)

    @property
    def fact_width(self) -> int:
        return {"kv": 2, "span": 2 * int(self.span),
                "passkey": len(_IS) + 2 * KEY_DIGITS + len(_REMEMBER) + len(_END)}[self.task]

    @property
    def query_len(self) -> int:
        return len(_WHAT) + len(_IS) + KEY_DIGITS if self.task == "passkey" else 2 * int(self.n_pairs)

    @property
    def context_len(self) -> int:
        return int(self.length) - self.query_len


@dataclass
class Question:
    """One scored answer: the positions whose next token is the answer (teacher-forced), and
    where that answer sits in the context (every copy), and the whole fact's span."""

    predict: list[int]  # positions t scored: the answer is ids[t + 1]
    answer_pos: list[list[int]]  # per answer token: its positions in the context (all copies)
    fact: tuple[int, int]  # [lo, hi) of the fact (key and value / the needle) in the context

    @property
    def distance(self) -> int:
        """Tokens from the latest answer copy to the first scored position."""
        return min(self.predict) - max(p for copies in self.answer_pos for p in copies)


@dataclass
class RecallItem:
    task: str
    split: str
    index: int
    ids: list[int]
    questions: list[Question] = field(default_factory=list)

    def loss_mask(self) -> np.ndarray:
        """uint8 [length]: 1 at the answer tokens (targets of the scored positions)."""
        mask = np.zeros(len(self.ids), dtype=np.uint8)
        for q in self.questions:
            mask[np.asarray(q.predict) + 1] = 1
        return mask


def _rng(spec: TaskSpec, split: str, seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng([_STREAM_TAG, TASKS.index(spec.task), SPLITS[split], int(seed), int(spec.length),
                                  int(spec.n_pairs), int(spec.span), int(spec.min_distance), int(spec.start),
                                  int(index)])


def _segments(rng: np.random.Generator, lo: int, hi: int, n: int, width: int) -> np.ndarray:
    """Starts of n non-overlapping segments of `width` tokens inside [lo, hi), uniformly placed:
    shrink each segment to one cell, choose n distinct cells, shift the i-th back by i * (width - 1)."""
    cells = (hi - lo) - n * (width - 1)
    chosen = np.sort(rng.choice(cells, size=n, replace=False))
    return lo + chosen + np.arange(n) * (width - 1)


def make_item(vocab: SlotRecallVocab, spec: TaskSpec, split: str, seed: int, index: int) -> RecallItem:
    """Item `index` of the (task, split, seed) stream; see the module doc for the layouts."""
    if split not in SPLITS:
        raise ConfigError(f"slot_recall: split must be one of {', '.join(SPLITS)}, got {split!r}")
    rng = _rng(spec, split, seed, index)
    ctx = spec.context_len
    ids = rng.integers(vocab.noise[0], vocab.noise[1], size=spec.length, dtype=np.int64)
    starts = _segments(rng, spec.start, ctx - spec.min_distance + 1, spec.n_facts, spec.fact_width)
    item = RecallItem(spec.task, split, int(index), [])
    if spec.task == "passkey":
        t = vocab.template[0]
        key = [vocab.digits[0] + int(c) for c in str(int(rng.integers(1000, 10000)))]
        s = int(starts[0])
        needle = [t + o for o in _IS] + key + [t + o for o in _REMEMBER] + key + [t + o for o in _END]
        ids[s:s + len(needle)] = needle
        first, second = s + len(_IS), s + len(_IS) + KEY_DIGITS + len(_REMEMBER)
        question = [t + o for o in _WHAT] + [t + o for o in _IS]
        ids[ctx:ctx + len(question)] = question
        ids[ctx + len(question):] = key
        last_q = ctx + len(question) - 1
        item.questions.append(Question(predict=list(range(last_q, last_q + KEY_DIGITS)),
                                       answer_pos=[[first + d, second + d] for d in range(KEY_DIGITS)],
                                       fact=(s, s + len(needle))))
    else:
        n = spec.n_facts
        rep = int(spec.span) if spec.task == "span" else 1
        keys = vocab.keys[0] + rng.choice(vocab.keys[1] - vocab.keys[0], size=n, replace=False)
        values = rng.integers(vocab.values[0], vocab.values[1], size=n, dtype=np.int64)
        where = rng.permutation(n)  # which fact sits at which place carries no information
        asked = rng.permutation(n)
        for j in range(n):
            s = int(starts[where[j]])
            ids[s:s + rep] = keys[j]
            ids[s + rep:s + 2 * rep] = values[j]
        for q, j in enumerate(asked):
            s, qpos = int(starts[where[j]]), ctx + 2 * q
            ids[qpos], ids[qpos + 1] = keys[j], values[j]
            item.questions.append(Question(predict=[qpos], answer_pos=[list(range(s + rep, s + 2 * rep))],
                                           fact=(s, s + 2 * rep)))
    item.ids = ids.tolist()
    return item


def recall_free_rate(vocab: SlotRecallVocab, item: RecallItem, question: Question) -> float:
    """Expected accuracy on `question` of a model that recalls nothing about which fact was asked:
    it knows which ids can be answers (the values, or the digits) and guesses each answer token
    uniformly among the distinct ones in the context before the question. A kv item with 4 facts
    whose values differ is answered this way 1 time in 4, a span item with 2 facts 1 in 2, so a
    measured rate is recall only by how far it lies above this reference (docs/method.md §6 i)."""
    lo, hi = vocab.digits if item.task == "passkey" else vocab.values
    seen = {t for t in item.ids[:min(question.predict) + 1] if lo <= t < hi}
    return 1.0 / max(1, len(seen)) ** len(question.predict)


def assert_disjoint(train: Iterable[RecallItem], held_out: Iterable[RecallItem]) -> None:
    """ConfigError if any held-out item's tokens equal a training item's (the check behind "never trained on")."""
    seen = {tuple(it.ids) for it in train}
    clash = [it.index for it in held_out if tuple(it.ids) in seen]
    if clash:
        raise ConfigError(f"slot_recall: held-out item(s) {clash[:5]} also occur in the training items")


# ------------------------------------------------------------------------------------ training data
def task_specs(cfg: Mapping[str, Any], length: int) -> dict[str, tuple[TaskSpec, float]]:
    """{task: (spec, fraction)} from a `tasks:` mapping ({kv: {fraction, n_pairs}, span: {...}, ...})."""
    tasks = cfg.get("tasks") or {}
    if not tasks:
        raise ConfigError("slot_recall: tasks must name at least one of " + ", ".join(TASKS))
    common = {k: int(cfg[k]) for k in ("min_distance", "start") if cfg.get(k) is not None}
    out = {}
    for name, opts in tasks.items():
        opts = dict(opts or {})
        fraction = float(opts.pop("fraction", 1.0))
        if not fraction > 0:
            raise ConfigError(f"slot_recall: tasks.{name}.fraction must be > 0, got {fraction}")
        unknown = set(opts) - {"n_pairs", "span"}
        if unknown:
            raise ConfigError(f"slot_recall: tasks.{name} has unknown key(s) {', '.join(sorted(unknown))}")
        out[str(name)] = (TaskSpec(str(name), int(length), **{k: int(v) for k, v in opts.items()}, **common), fraction)
    return out


def training_examples(vocab: SlotRecallVocab, specs: dict[str, tuple[TaskSpec, float]], split: str, n: int,
                      seed: int) -> Iterator[tuple[list[int], list[int]]]:
    """n (ids, mask) examples of the task mixture; example i's task is drawn with the fractions."""
    names = list(specs)
    p = np.asarray([specs[k][1] for k in names], dtype=np.float64)
    choice = np.random.default_rng([_STREAM_TAG, SPLITS[split], int(seed), 7]).choice(len(names), size=n, p=p / p.sum())
    for i, c in enumerate(choice):
        item = make_item(vocab, specs[names[c]][0], split, seed, i)
        yield item.ids, item.loss_mask().tolist()


def _tokenizer(cfg: Mapping[str, Any], out: Path, vocab: SlotRecallVocab):
    """The folder's tokenizer.model: none of these tasks reads text, but a prepared folder carries one
    and the model's vocabulary is its size. Trained in well under a second on the demo grammar, or
    `tokenizer.path` reused (a model pretrained on that tokenizer's data continues on the ladder)."""
    from anchormass.data.demo_corpus import demo_documents
    from anchormass.data.tokenizer import train_tokenizer

    if (cfg.get("tokenizer") or {}).get("path"):  # another stage's tokenizer, so its checkpoints can continue here
        from anchormass.data.prepare import _tokenizer as reuse

        tok = reuse(cfg, out, lambda: [])
        vocab.check_fits(tok.vocab_size, who=f"tokenizer {cfg['tokenizer']['path']}")
        return tok
    size = int((cfg.get("tokenizer") or {}).get("vocab_size", 512))
    vocab.check_fits(size, who=f"data.tokenizer.vocab_size={size}")
    docs = list(demo_documents(n_docs=12, seed=7, min_sentences=40, max_sentences=80))
    return train_tokenizer(docs, out / "tokenizer.model", size, model_type="bpe", character_coverage=1.0)


def prepare_slot_recall(cfg: Mapping[str, Any], out: Path) -> dict[str, Any]:
    """`kind: slot_recall` (anchormass/data/prepare.py): train/val splits of the task mixture."""
    from anchormass.data.prepare import _base_meta, _write_sft_split

    scfg = dict(cfg.get("slot_recall") or {})
    vocab = SlotRecallVocab.from_config(scfg.get("vocab"))
    length = int(scfg.get("length", 513))
    specs = task_specs(scfg, length)
    seed = int(scfg.get("seed", 0))
    counts = {"train": int(scfg.get("n_train", 4096)), "val": int(scfg.get("n_val", 64))}
    if min(counts.values()) < 1:
        raise ConfigError(f"slot_recall: n_train and n_val must be >= 1, got {counts}")
    tok = _tokenizer(cfg, out, vocab)
    desc = f"slot-recall ladder ({', '.join(specs)}), {length} tokens, synthetic token space"
    splits = {name: _write_sft_split(out, name, training_examples(vocab, specs, name, n, seed), tok, {"source": desc})
              for name, n in counts.items()}
    plain = {k: {"fraction": f, "n_pairs": s.n_pairs, "span": s.span} for k, (s, f) in specs.items()}
    first = next(iter(specs.values()))[0]
    return {**_base_meta(cfg, "sft", tok, desc), "splits": splits,
            "slot_recall": {"vocab": vocab.as_dict(), "length": length, "seed": seed, "tasks": plain,
                            "min_distance": first.min_distance, "start": first.start}}
