"""Can this model learn retrieval, and how fast? A learning-curve probe on synthetic recall tasks.

Retrieval (passkey, MQAR) needs an induction circuit: one head copies the previous token into each
position, a later head finds the earlier position whose previous token is the current one and
reads what followed. Small models learn it late and abruptly, so "the model does not retrieve" is
first a question of steps. This probe trains a model preset (optionally changed field by field) on
one synthetic task, with a fixed held-out set, and records held-out recall accuracy against steps:

- `mqar`: the MQAR items of data/mqar.py (keys, values and noise from disjoint id ranges), loss
  and accuracy on the values after the query keys (docs/method.md §6 g);
- `copy`: rows of random segments, each said twice (`<a> seg <b> seg`) with the segment length
  drawn per segment; loss and accuracy on the repeats, the only tokens that are predictable, and
  only by finding the first saying (a fixed distance could be solved by position alone).

The held-out items never occur in training (their own seed), so accuracy above chance is recall
in context, not memorisation. Everything is seeded; one thread by default (noisy shared CPUs).

The training pieces are the project's (anchormass/training/): AdamW over `optim.param_groups`,
the lr of `optim.lr_factor` with `min_lr_ratio` 1 (linear warm-up, then constant: a probe measures
when, not how well), and the Lightning module's loss (`loss.chunked_cross_entropy`, unscored
targets = IGNORE_INDEX).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from anchormass.errors import ConfigError
from anchormass.training.loss import IGNORE_INDEX, chunked_cross_entropy
from anchormass.training.optim import lr_factor, param_groups

TASKS = ("mqar", "copy")
COPY_MARKS = (5, 6)  # the two marker ids around a segment's first saying (any ids below the range)


@dataclass
class ProbeConfig:
    task: str = "mqar"
    steps: int = 1000
    batch_size: int = 32
    seq_len: int = 128
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.0
    clip: float = 1.0
    eval_every: int = 50
    eval_items: int = 128
    seed: int = 0
    mqar: dict = field(default_factory=lambda: {"vocab": None, "n_pairs": 8, "alpha": 1.0})
    copy: dict = field(default_factory=lambda: {"ids": [100, 164], "min_len": 6, "max_len": 24})

    def check(self, vocab_size: int) -> None:
        if self.task not in TASKS:
            raise ConfigError(f"recall probe: task must be one of {TASKS}, got {self.task!r}")
        for key in ("steps", "batch_size", "seq_len", "eval_every", "eval_items"):
            if int(getattr(self, key)) < 1:
                raise ConfigError(f"recall probe: {key} must be >= 1, got {getattr(self, key)}")
        if self.task == "copy":
            lo, hi = (int(i) for i in self.copy["ids"])
            if not 0 <= lo < hi <= vocab_size or max(COPY_MARKS) >= lo:
                raise ConfigError(f"recall probe: copy.ids [{lo}, {hi}) must lie in [{max(COPY_MARKS) + 1}, "
                                  f"{vocab_size}) (the model's vocabulary, above the marker ids)")
            if not 1 <= int(self.copy["min_len"]) <= int(self.copy["max_len"]):
                raise ConfigError("recall probe: copy needs 1 <= min_len <= max_len")


class RecallTask:
    """Batches (ids [B, T+1], loss mask [B, T]) of one task; `index` numbers the items so the same
    (seed, index) is the same item wherever it is drawn."""

    def __init__(self, cfg: ProbeConfig, vocab_size: int):
        cfg.check(vocab_size)
        self.cfg = cfg
        if cfg.task == "mqar":
            from anchormass.data.mqar import MQARVocab, check_shape

            self.vocab = MQARVocab.from_config(cfg.mqar.get("vocab") or {})
            self.vocab.check_fits(vocab_size)
            self.n_pairs = int(cfg.mqar.get("n_pairs", 8))
            self.alpha = float(cfg.mqar.get("alpha", 1.0))
            check_shape(self.vocab, cfg.seq_len + 1, self.n_pairs, self.n_pairs, self.alpha)

    def chance(self) -> float:
        if self.cfg.task == "mqar":
            return 1.0 / (self.vocab.values[1] - self.vocab.values[0])
        lo, hi = self.cfg.copy["ids"]
        return 1.0 / (int(hi) - int(lo))

    def _row(self, seed: int, index: int) -> tuple[np.ndarray, np.ndarray]:
        T = self.cfg.seq_len + 1
        if self.cfg.task == "mqar":
            from anchormass.data.mqar import training_example

            ids, mask = training_example(self.vocab, T, self.n_pairs, self.n_pairs, seed, index, self.alpha)
            return ids, mask.astype(bool)
        rng = np.random.default_rng([seed, index])
        c = self.cfg.copy
        ids, mask = [], []
        while len(ids) < T:
            seg = rng.integers(int(c["ids"][0]), int(c["ids"][1]), int(rng.integers(c["min_len"], c["max_len"] + 1)))
            ids += [COPY_MARKS[0], *seg, COPY_MARKS[1], *seg]
            mask += [False] * (len(seg) + 2) + [True] * len(seg)
        return np.asarray(ids[:T], dtype=np.int64), np.asarray(mask[:T], dtype=bool)

    def batch(self, seed: int, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self._row(seed, start + i) for i in range(n)]
        ids = torch.from_numpy(np.stack([r[0] for r in rows]))
        mask = torch.from_numpy(np.stack([r[1] for r in rows]))[:, 1:]  # mask[t]: target ids[t + 1]
        return ids, mask

    def held_out(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """n items training never draws: a seed of their own."""
        return self.batch(self.cfg.seed + 1_000_003, 0, n)


def masked_loss_and_hits(model, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(mean CE over the masked targets, argmax hits among them, their count) for ids [B, T+1], mask [B, T]."""
    hidden = model.forward_hidden(ids[:, :-1])  # [B, T, D]
    targets = ids[:, 1:].masked_fill(~mask, IGNORE_INDEX)
    loss, n = chunked_cross_entropy(hidden, model.lm_head, targets)
    with torch.no_grad():
        hits = int((model.lm_head(hidden).argmax(-1) == targets).sum())  # IGNORE_INDEX is never an argmax
    return loss, hits, int(n)


@torch.no_grad()
def evaluate(model, task: RecallTask, held_out: tuple[torch.Tensor, torch.Tensor], batch_size: int) -> dict:
    ids, mask = held_out
    was_training = model.training
    model.eval()
    loss, hits, n = 0.0, 0, 0
    for s in range(0, len(ids), batch_size):
        lb, h, k = masked_loss_and_hits(model, ids[s:s + batch_size], mask[s:s + batch_size])
        loss, hits, n = loss + float(lb) * k, hits + h, n + k
    model.train(was_training)
    return {"loss": loss / max(n, 1), "hits": hits, "n": n, "accuracy": hits / max(n, 1)}


def train_probe(model, cfg: ProbeConfig, progress=None) -> list[dict]:
    """Trains `model` in place; returns one record per evaluation (step 0 = before training):
    step, train loss (mean since the last record), held-out loss / hits / n / accuracy, seconds."""
    task = RecallTask(cfg, model.cfg.vocab_size)
    torch.manual_seed(cfg.seed)
    held_out = task.held_out(cfg.eval_items)
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.95))
    # Linear warm-up, then constant (min_lr_ratio 1); warm-up may outlast a short probe.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, cfg.warmup, cfg.steps, 1.0))
    records = [{"step": 0, "train_loss": math.nan, **evaluate(model, task, held_out, cfg.batch_size), "seconds": 0.0}]
    if progress is not None:
        progress(records[0])
    model.train()
    t0, losses = time.perf_counter(), []
    for step in range(1, cfg.steps + 1):
        ids, mask = task.batch(cfg.seed, (step - 1) * cfg.batch_size, cfg.batch_size)
        loss, _, _ = masked_loss_and_hits(model, ids, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if step % cfg.eval_every == 0 or step == cfg.steps:
            rec = {"step": step, "train_loss": float(np.mean(losses)),
                   **evaluate(model, task, held_out, cfg.batch_size), "seconds": time.perf_counter() - t0}
            records.append(rec)
            losses = []
            if progress is not None:
                progress(rec)
    chance = task.chance()
    for r in records:
        r["chance"] = chance
    return records


def steps_to(records: list[dict], accuracy: float) -> int | None:
    """The first evaluated step whose held-out accuracy reaches `accuracy` (None: never)."""
    return next((r["step"] for r in records if r["accuracy"] >= accuracy), None)
