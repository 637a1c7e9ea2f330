"""(i) Recall through slots, the ladder of tasks: docs/method.md §6 i.

Items come from anchormass/data/slot_recall.py (split `eval`, a stream the training data never
draws from), identical for every model. A question is correct when the argmax over the whole
vocabulary is the answer at every scored position, teacher-forced (for the 4-digit key this is
exactly greedy decoding's exact match). mode=parallel: one forward per batch; mode=cached: the
context is prefilled through the inference cache under `policy` / `budget`, then the rest fed one
token at a time (anchormass/eval/predictions.py, as suite=mqar). Per cell (task, length) and model: accuracy
with a Wilson 95% interval, exact McNemar of every model against the first on identical questions,
and from the parallel forward (anchormass/eval/slot_probe.py; stage 2 never acts there) what
stage 1 kept of each answer copy, the attention the answering query puts on the fact, and the
outlier emit rate, per layer.

More models than the two evaluate.py loads: `also` lists run folders (relative to the folder that
holds model A's run folder, e.g. `anchormass_faithful_g1/slot_recall`) or checkpoint files, each
scored on the same items, so one evaluation covers every cell of a study. `curve` scores every
periodic checkpoint (`step-*.ckpt`) of every model on the first `curve.n_items` items per task:
held-out recall against training steps. Over training seeds the aggregate hook pools per cell
(mean ± std, pooled Wilson, McNemar over pooled pairs) and averages the curves.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from anchormass.config_checks import check_numbers
from anchormass.data.slot_recall import TASKS, SlotRecallVocab, TaskSpec, make_item, recall_free_rate
from anchormass.errors import ConfigError
from anchormass.eval import tables
from anchormass.eval.common import fmt_p, progress
from anchormass.eval.predictions import cached_predictions, parallel_predictions
from anchormass.eval.slot_probe import KEPT, STATUSES, LayerView, probe_forward
from anchormass.eval.stats import mcnemar_exact, wilson_interval
from anchormass.eval.suite import EvalContext, EvalModel, Suite
from anchormass.eval.suites.slot_recall_format import fmt_share, mean_present, status_text

STEP_CKPT = re.compile(r"step-(\d+)\.ckpt$")


def _rate(k: int, n: int) -> dict:
    lo, hi = wilson_interval(k, n)
    return {"correct": k, "n": n, "acc": k / n if n else float("nan"), "ci": [lo, hi]}


def score_batch(model, items, mode: str, chunk=None, policy=None, budget=None, probe: bool = True,
                vocab: SlotRecallVocab | None = None) -> list[dict]:
    """One record per question of `items` (one task and length: shared scored positions)."""
    positions = [p for q in items[0].questions for p in q.predict]
    ids = torch.tensor([it.ids[:-1] for it in items], dtype=torch.long, device=next(model.parameters()).device)
    views = None
    if mode == "parallel" and probe:
        pred, qkv = probe_forward(model, ids, positions)
        views = [LayerView(model.cfg, layer) for layer in qkv]
    elif mode == "parallel":
        pred = parallel_predictions(model, ids, positions)
    else:  # the session scores t .. T-2 of what it is fed, so it reads the whole item (RoPE base of its length)
        full = torch.tensor([it.ids for it in items], dtype=torch.long, device=ids.device)
        pred, _ = cached_predictions(model, full, min(positions), positions, chunk, policy, budget)
        if probe:
            _, qkv = probe_forward(model, ids, positions[:1])
            views = [LayerView(model.cfg, layer) for layer in qkv]
    col = {p: j for j, p in enumerate(positions)}
    out = []
    for b, it in enumerate(items):
        for qi, q in enumerate(it.questions):
            correct = all(int(pred[b, col[t]]) == it.ids[t + 1] for t in q.predict)
            rec = {"task": it.task, "length": len(it.ids), "item": it.index, "query": qi, "correct": bool(correct),
                   "distance": q.distance}
            if vocab is not None:
                rec["recall_free"] = recall_free_rate(vocab, it, q)
            if views is not None:
                first = min(q.predict)
                layers = []
                for v in views:
                    st = [[v.status(b, p, first) for p in copies] for copies in q.answer_pos]
                    layers.append({"status": {s: sum(x == s for c in st for x in c) for s in STATUSES if
                                              any(x == s for c in st for x in c)},
                                   "all_kept": all(any(x in KEPT for x in c) for c in st),
                                   "attn": float(np.mean([v.attention_on(b, t, *q.fact) for t in q.predict])),
                                   "emit": v.emit_rate(b)})
                rec["layers"] = layers
            out.append(rec)
    return out


def cell_summary(records: list[dict], n_layers: int) -> dict:
    """Accuracy with CI, the recall-free reference, and per layer: answer-copy status fractions,
    all-kept rate, attention, emit rate."""
    out = _rate(sum(r["correct"] for r in records), len(records))
    out["recall_free"] = mean_present(r.get("recall_free") for r in records)
    probed = [r for r in records if "layers" in r]
    if probed:
        layers = []
        for li in range(n_layers):
            counts = {s: sum(r["layers"][li]["status"].get(s, 0) for r in probed) for s in STATUSES}
            total = sum(counts.values())
            layers.append({"status": {s: c / total for s, c in counts.items() if c} if total else {},
                           "all_kept": float(np.mean([r["layers"][li]["all_kept"] for r in probed])),
                           "attn": mean_present(r["layers"][li]["attn"] for r in probed),
                           "emit": mean_present(r["layers"][li]["emit"] for r in probed)})
        out["layers"] = layers
        kept = [r for r in probed if r["layers"][-1]["all_kept"]]
        out["acc_if_kept_last_layer"] = _rate(sum(r["correct"] for r in kept), len(kept))
    return out


def checkpoint_step(path: Path) -> int | None:
    m = STEP_CKPT.search(path.name)
    return int(m.group(1)) if m else None


class SlotRecallSuite(Suite):
    name = "slot_recall"

    def check(self, ctx: EvalContext) -> None:
        super().check(ctx)
        check_numbers(self.cfg, {"n_items": int, "batch_size": int, "seed": int, "min_distance": int,
                                 "start": int, "chunk": int}, "slot_recall.")
        self.vocab = SlotRecallVocab.from_config(self.opt("vocab"))
        tasks = self.opt("tasks") or {t: {} for t in TASKS}
        lengths = [int(x) for x in (self.opt("lengths") or [513])]
        common = {k: int(self.opt(k)) for k in ("min_distance", "start") if self.opt(k) is not None}
        self.specs: list[TaskSpec] = []
        for name, opts in tasks.items():
            opts = {k: int(v) for k, v in dict(opts or {}).items() if k != "fraction"}
            self.specs += [TaskSpec(str(name), L, **opts, **common) for L in lengths]
        self.n_items = int(self.opt("n_items", 64))
        self.batch_size = int(self.opt("batch_size", 16))
        self.seed = int(self.opt("seed", 0))
        self.mode = self.opt("mode", "parallel")
        if self.mode not in ("parallel", "cached"):
            raise ConfigError(f"slot_recall.mode must be parallel or cached, got {self.mode!r}")
        if (self.mode == "parallel"
                and any(self.opt(k) is not None for k in ("policy", "budget", "kv_policy", "kv_budget"))):
            raise ConfigError("slot_recall: policy / budget / kv_policy / kv_budget apply to mode=cached only")
        if self.n_items < 1 or self.batch_size < 1:
            raise ConfigError("slot_recall: n_items and batch_size must be at least 1")
        labels = self.opt("labels")
        if labels is not None and len(labels) != len(ctx.models):
            raise ConfigError(f"slot_recall.labels names {len(labels)} models; evaluate.py loaded {len(ctx.models)}")
        self.models = list(ctx.models)
        for m, lab in zip(self.models, labels or []):
            m.label = str(lab)
        self.left_out: list[str] = []
        self.models += [m for m in (self._load_also(ctx, entry) for entry in self.opt("also") or []) if m is not None]
        seen = [m.label for m in self.models]
        if len(set(seen)) < len(seen):
            raise ConfigError(f"slot_recall: model labels must be distinct, got {seen} (set slot_recall.labels)")
        for m in self.models:
            self.vocab.check_fits(int(m.config.vocab_size), who=f"model '{m.label}'")
        for spec in self.specs:
            ctx.check_length("slot_recall", spec.length - 1)
        if self.mode == "cached":
            from anchormass.cache import new_cache

            for m in self.models:  # an unknown policy / missing budget fails here, not after other models ran
                try:
                    new_cache(m.model, 1, *self.session(m.model))
                except ConfigError as err:
                    raise ConfigError(f"slot_recall: {err} ('{m.label}')") from None
        curve = self.opt("curve")
        self.curve_items = None if not curve else int(dict(curve).get("n_items", 16))

    def _also_path(self, ctx: EvalContext, entry: dict) -> Path:
        """{ckpt: <file>} as given; {run: <model>/<stage>} beside model A's run folder, `{seed}` in it
        replaced by the name of the folder that holds A's run (seed<s>: another curriculum's same seed)."""
        if entry.get("ckpt"):
            return Path(str(entry["ckpt"])).expanduser()
        source = Path(ctx.models[0].source)
        if not source.is_file():
            raise ConfigError("slot_recall.also: run=... needs model A loaded from a checkpoint (ckpt=)")
        # <root>/<model>/<stage>/checkpoints/last.ckpt -> <root>/<run>/checkpoints/last.ckpt
        root = source.parents[3]
        return root / str(entry["run"]).replace("{seed}", root.name) / "checkpoints" / "last.ckpt"

    def _load_also(self, ctx: EvalContext, entry) -> EvalModel | None:
        """An extra model: {label, run | ckpt, optional}; an optional one that is not there is left out."""
        from anchormass.eval.loading import load_one

        entry = dict(entry or {})
        if not entry.get("label") or bool(entry.get("run")) == bool(entry.get("ckpt")):
            raise ConfigError(f"slot_recall.also: each entry needs a label and one of run / ckpt, got {entry}")
        path = self._also_path(ctx, entry)
        if not path.is_file() and entry.get("optional"):
            self.left_out.append(f"{entry['label']} (no {path})")
            return None
        dtype = next(ctx.models[0].model.parameters()).dtype
        m = load_one(str(path), None, f"slot_recall.also {entry['label']}", ctx.device, dtype, ctx.seed)
        m.label = str(entry["label"])
        return m

    def items(self, spec: TaskSpec, n: int):
        return [make_item(self.vocab, spec, "eval", self.seed, i) for i in range(n)]

    def session(self, model) -> tuple:
        """(policy, budget) of a model's cache: `policy`/`budget` for AnchorMass (slots), `kv_policy`/
        `kv_budget` for Standard (tokens per head; default the full cache)."""
        if model.cfg.arch == "anchormass":
            return self.opt("policy"), self.opt("budget")
        return self.opt("kv_policy"), self.opt("kv_budget")

    def _score(self, model, spec: TaskSpec, n: int, probe: bool) -> list[dict]:
        items, recs = self.items(spec, n), []
        for s in range(0, len(items), self.batch_size):
            recs += score_batch(model, items[s:s + self.batch_size], self.mode if probe else "parallel",
                                self.opt("chunk"), *self.session(model), probe=probe, vocab=self.vocab)
        return recs

    def _curve(self, m: EvalModel) -> list[dict]:
        """Held-out accuracy per task at each periodic checkpoint of m's run (parallel mode)."""
        from anchormass.training.checkpoint import load_model

        folder = Path(m.source).parent
        ckpts = sorted((checkpoint_step(p), p) for p in folder.glob("step-*.ckpt") if checkpoint_step(p) is not None)
        points = []
        for step, path in ckpts:
            model, _ = load_model(path, map_location="cpu")
            model.to(device=next(m.model.parameters()).device, dtype=next(m.model.parameters()).dtype).eval()
            accs = {}
            for spec in self.specs:
                recs = self._score(model, spec, self.curve_items, probe=False)
                accs[f"{spec.task}/{spec.length}"] = {**_rate(sum(r["correct"] for r in recs), len(recs)),
                                                      "recall_free": mean_present(r.get("recall_free") for r in recs)}
            points.append({"step": step, "cells": accs})
        return points

    def run(self, ctx: EvalContext) -> dict:
        labels = [m.label for m in self.models]
        records, cells = [], {}
        for m in self.models:
            for spec in progress(self.specs, ctx.progress, f"slot_recall [{m.label}]"):
                recs = [{**r, "model": m.label} for r in self._score(m.model, spec, self.n_items, probe=True)]
                records += recs
                key = f"{spec.task}/{spec.length}"
                cells.setdefault(key, {"task": spec.task, "length": spec.length})[m.label] = cell_summary(
                    recs, m.config.n_layers)
        ident = lambda r: (r["task"], r["length"], r["item"], r["query"])  # noqa: E731
        for key, c in cells.items():
            by = {lab: {ident(r): r["correct"] for r in records if r["model"] == lab
                        and f"{r['task']}/{r['length']}" == key} for lab in labels}
            common = sorted(by[labels[0]])
            c["paired"] = {lab: mcnemar_exact([by[labels[0]][k] for k in common], [by[lab][k] for k in common])
                           for lab in labels[1:]}
        curves = {}
        if self.curve_items:
            for m in self.models:
                if Path(m.source).is_file():
                    curves[m.label] = self._curve(m)
        summary = {f"{lab}/{k}/acc": c[lab]["acc"] for k, c in cells.items() for lab in labels}
        return {"labels": labels, "models": {m.label: {"source": m.source, "arch": m.arch,
                                                       "group_size": m.config.group_size,
                                                       "n_layers": m.config.n_layers, "head_dim": m.config.head_dim}
                                             for m in self.models},
                "left_out": self.left_out, "mode": self.mode,
                "policy": self.opt("policy"), "budget": self.opt("budget"),
                "kv_policy": self.opt("kv_policy"), "kv_budget": self.opt("kv_budget"),
                "n_items": self.n_items, "seed": self.seed, "vocab": self.vocab.as_dict(),
                "tasks": [vars(s) for s in self.specs], "cells": list(cells.values()), "curves": curves,
                "items": records, "summary": summary}

    # -------------------------------------------------------------------------------- report
    def report(self, result: dict) -> str:
        note = "".join(f"\nLeft out (optional, not trained): {x}\n" for x in result.get("left_out") or [])
        return render_table(result["labels"], result["cells"], result["models"], result) + curve_note(result) + note

    def plots(self, result: dict, out_dir: Path) -> list[str]:
        from anchormass.eval.suites.slot_recall_plots import learning_curves, recall_by_model

        out = [recall_by_model(result["labels"], result["cells"], out_dir / "slot_recall_by_model.png")]
        if result.get("curves"):
            out.append(learning_curves(result["curves"], out_dir / "slot_recall_curves.png"))
        return out

    @classmethod
    def aggregate(cls, per_seed: list[dict], seeds: list[int]) -> dict:
        from anchormass.eval.suites.slot_recall_pool import pool_seeds

        return pool_seeds(per_seed, seeds)


def render_table(labels, cells, models, result) -> str:
    head = ["task", "length", "model", "accuracy [95% CI]", "recall-free", "vs " + labels[0] + " (McNemar p)",
            "answer copies: outlier / anchor / averaged %", "all answer tokens kept (last layer)",
            "attention on fact (mean over layers)", "emit rate (mean over layers)"]
    body = []
    for c in cells:
        for lab in labels:
            s = c[lab]
            layers = s.get("layers") or []
            emit = mean_present(lay["emit"] for lay in layers)
            paired = (c.get("paired") or {}).get(lab)
            body.append([c["task"], f"{c['length'] - 1:,}", lab,
                         f"{tables.pct(s['correct'], s['n'])} [{100 * s['ci'][0]:.1f}, {100 * s['ci'][1]:.1f}]",
                         fmt_share(s.get("recall_free")),
                         "-" if paired is None else f"{paired['b']}/{paired['c']} (p {fmt_p(paired['p'])})",
                         status_text(layers), fmt_share(layers[-1]["all_kept"]) if layers else "-",
                         fmt_share(mean_present(lay["attn"] for lay in layers)), fmt_share(emit)])
    setting = f"mode: {result['mode']}"
    if result["mode"] == "cached":
        setting += (f", AnchorMass policy / budget: {result['policy'] or 'default'} / {result['budget'] or 'default'}, "
                    f"Standard: {result.get('kv_policy') or 'full cache'} / {result.get('kv_budget') or '-'}")
    per_layer = ["", "Per layer (attention on the fact / emit rate / all answer tokens kept):", ""]
    for c in cells:
        for lab in labels:
            layers = c[lab].get("layers") or []
            per_layer.append(f"- {c['task']} {lab}: " + "; ".join(
                f"L{i}: {fmt_share(lay['attn'])} / {fmt_share(lay['emit'])} / {fmt_share(lay['all_kept'])}"
                for i, lay in enumerate(layers)))
    return ("## Recall through slots (the slot-recall ladder)\n\n" + tables.markdown(head, body) +
            f"\n{setting}; {result['n_items']} held-out items per task (split `eval`, seed {result['seed']}); a "
            "question is correct when every answer token is the argmax (teacher-forced). Recall-free: the rate a model "
            "that guesses each answer token among the distinct answer-type ids (values / digits) in its context would "
            "reach, the floor a rate must clear to show recall. McNemar: b/c = "
            f"{labels[0]} right and the model wrong / the reverse. Answer copies, kept tokens, attention and emit "
            "rate come from the parallel forward (stage 1 only): outlier = own slot, anchor = its key anchors "
            "the group's background slot, averaged = only in the background mean.\n" + "\n".join(per_layer) + "\n")


def curve_note(result: dict) -> str:
    curves = result.get("curves") or {}
    if not curves:
        return ""
    lines = ["", "### Held-out recall against training steps", ""]
    for lab, points in curves.items():
        lines.append(f"- {lab}: " + "; ".join(
            f"step {p['step']}: " + ", ".join(f"{k.split('/')[0]} {100 * v['acc']:.0f}%" for k, v in p["cells"].items())
            for p in points))
    return "\n".join(lines) + "\n"
