"""(g) Multi-query associative recall in token space, docs/method.md §6 g.

Items come from `anchormass.data.mqar` (identical for every model). A query is correct when the
argmax over the whole vocabulary at the query key's position is its value, with the true query
region fed (teacher forcing), so one wrong answer does not disturb the next query.

mode=parallel: one forward of each item batch. mode=cached: the context is prefilled through
the inference cache under `policy` / `budget` and ends the prefill (a KV policy such as SnapKV
compresses there), then the query region is fed one token at a time; the cache's stored bytes
are recorded per cell.
"""

from __future__ import annotations

from pathlib import Path

import torch

from anchormass.cache import new_cache
from anchormass.config_checks import check_numbers
from anchormass.data.mqar import MQARItem, MQARVocab, check_shape, make_item
from anchormass.errors import ConfigError
from anchormass.eval.report import KIB, fmt_p, markdown, mcnemar_exact, pct, plt, save_figure, wilson_interval
from anchormass.eval.scoring import OOM, cached_predictions, free_memory, is_oom, parallel_predictions, progress
from anchormass.eval.suite import EvalContext, EvalModel, Suite


def distance_bucket(d: int) -> int:
    """Lower edge of d's power-of-two bucket: 0, 1, 2, 4, 8, ..."""
    return 0 if d < 1 else 1 << (int(d).bit_length() - 1)


def cell_stats(records: list[dict]) -> dict:
    n = len(records)
    k = sum(r["correct"] for r in records)
    lo, hi = wilson_interval(k, n)
    by_dist: dict[int, list[int]] = {}
    for r in records:
        c = by_dist.setdefault(distance_bucket(r["distance"]), [0, 0])
        c[0] += r["correct"]
        c[1] += 1
    return {"n": n, "correct": k, "acc": k / n if n else float("nan"), "ci": [lo, hi],
            "n_items": len({r["item"] for r in records}),
            "by_distance": {str(b): {"correct": c, "n": m} for b, (c, m) in sorted(by_dist.items())}}


class MqarSuite(Suite):
    name = "mqar"

    def check(self, ctx: EvalContext) -> None:
        super().check(ctx)
        self.vocab = MQARVocab.from_config(self.opt("vocab"))
        check_numbers(self.cfg, {"n_queries": int, "n_items": int, "batch_size": int, "seed": int,
                                 "alpha": float, "chunk": int}, "mqar.")
        self.lengths, self.n_pairs = (self._int_list(key) for key in ("lengths", "n_pairs"))
        nq = self.opt("n_queries")
        self.n_queries = None if nq is None else int(nq)
        self.n_items = int(self.opt("n_items", 20))
        self.batch_size = int(self.opt("batch_size", 4))
        self.seed, self.alpha = int(self.opt("seed", 0)), float(self.opt("alpha", 0.0))
        self.mode = self.opt("mode", "parallel")
        if self.mode not in ("parallel", "cached"):
            raise ConfigError(f"mqar.mode must be parallel or cached, got {self.mode!r}")
        if self.n_items < 1 or self.batch_size < 1:
            raise ConfigError("mqar: n_items and batch_size must be at least 1")
        if self.mode == "parallel" and (self.opt("policy") is not None or self.opt("budget") is not None):
            raise ConfigError("mqar: policy / budget apply to mode=cached only")
        for m in ctx.models:
            try:
                self.vocab.check_fits(int(m.config.vocab_size))
            except ConfigError as err:
                raise ConfigError(f"{err} ('{m.label}')") from None
        for L in self.lengths:
            ctx.check_length("mqar", L)
        self.cells = [(L, P) for L in self.lengths for P in self.n_pairs]
        for L, P in self.cells:
            check_shape(self.vocab, L, P, self.queries(P), self.alpha)
        if self.mode == "cached":
            if self.opt("chunk") is not None and int(self.opt("chunk")) < 1:
                raise ConfigError(f"mqar.chunk must be a positive integer or null, got {self.opt('chunk')!r}")
            for m in ctx.models:  # an unknown policy / missing budget fails here, not after other models ran
                try:
                    new_cache(m.model, 1, self.opt("policy"), self.opt("budget"))
                except ConfigError as err:
                    raise ConfigError(f"mqar: {err} ('{m.label}')") from None

    def _int_list(self, key: str) -> list[int]:
        value = self.opt(key)
        try:
            out = [int(x) for x in value]
        except (TypeError, ValueError):
            out = []
        if not out:
            raise ConfigError(f"mqar.{key} must be a non-empty list of integers, got {value!r}")
        return out

    def queries(self, n_pairs: int) -> int:
        return n_pairs if self.n_queries is None else min(self.n_queries, n_pairs)

    def items(self, length: int, n_pairs: int) -> list[MQARItem]:
        return [make_item(self.vocab, length, n_pairs, self.queries(n_pairs), self.seed, i, self.alpha)
                for i in range(self.n_items)]

    def _run_cell(self, ctx: EvalContext, m: EvalModel, items: list[MQARItem]) -> tuple[list[dict], dict | None]:
        records, stored = [], None
        positions = items[0].query_pos  # shared by every item of the cell
        for s in range(0, len(items), self.batch_size):
            batch = items[s:s + self.batch_size]
            ids = torch.tensor([it.ids for it in batch], dtype=torch.long, device=ctx.device)
            if self.mode == "parallel":
                pred = parallel_predictions(m.model, ids, positions)
            else:
                pred, meter = cached_predictions(m.model, ids, batch[0].context_len, positions, self.opt("chunk"),
                                                 self.opt("policy"), self.opt("budget"))
                stored = stored or {"stored_prefill": 0, "stored_end": 0}
                stored["stored_prefill"] += meter.stored_prefill
                stored["stored_end"] += meter.stored_end
            for it, row in zip(batch, pred.tolist()):
                for q, (v, d) in enumerate(zip(it.values, it.distances)):
                    records.append({"model": m.label, "length": it.length, "n_pairs": it.n_pairs, "item": it.index,
                                    "query": q, "correct": bool(row[q] == v), "distance": d})
        if stored is not None:  # per item: the meter sums over the batch
            stored = {k: v / len(items) for k, v in stored.items()}
        return records, stored

    def run(self, ctx: EvalContext) -> dict:
        labels = [m.label for m in ctx.models]
        records: list[dict] = []
        cells: dict[str, dict] = {}
        cell_items = {c: self.items(*c) for c in self.cells}
        for m in ctx.models:
            for L, P in progress(self.cells, ctx.progress, f"mqar [{m.label}]"):
                status = "ok"
                try:
                    recs, stored = self._run_cell(ctx, m, cell_items[(L, P)])
                except Exception as err:  # running out of memory at a length is a result
                    if not is_oom(err):
                        raise
                    free_memory(ctx.device)
                    recs, stored, status = [], None, OOM
                records += recs
                cells.setdefault(f"{L}/{P}", {"length": L, "n_pairs": P, "n_queries": self.queries(P)})
                cells[f"{L}/{P}"][m.label] = {**cell_stats(recs), "stored_bytes": stored, "status": status}
        if ctx.paired:
            for c in cells.values():
                L, P = c["length"], c["n_pairs"]
                if any(c[lab]["status"] != "ok" for lab in labels):
                    c["paired"] = None
                    continue
                ident = lambda r: (r["item"], r["query"])  # noqa: E731
                a, b = ({ident(r): r["correct"] for r in records
                         if r["model"] == lab and r["length"] == L and r["n_pairs"] == P} for lab in labels)
                common = sorted(set(a) & set(b))
                c["paired"] = mcnemar_exact([a[k] for k in common], [b[k] for k in common])
        summary = {f"{lab}/len{c['length']}/pairs{c['n_pairs']}/acc": c[lab]["acc"]
                   for c in cells.values() for lab in labels if c[lab]["status"] == "ok"}
        return {"labels": labels, "lengths": self.lengths, "n_pairs": self.n_pairs, "mode": self.mode,
                "policy": self.opt("policy"), "budget": self.opt("budget"), "n_items": self.n_items,
                "n_queries": self.n_queries, "seed": self.seed, "alpha": self.alpha,
                "vocab": {k: list(getattr(self.vocab, k)) for k in ("keys", "values", "noise")},
                "cells": list(cells.values()), "items": records, "summary": summary}

    def report(self, result: dict) -> str:
        labels = result["labels"]
        cached = result["mode"] == "cached"
        head = ["length", "pairs"] + [f"{lab} accuracy [95% CI]" for lab in labels]
        if cached:
            head += [f"{lab} stored KiB (prefill / end)" for lab in labels]
        if len(labels) == 2:
            head += [f"acc diff ({labels[1]} − {labels[0]})", "McNemar p"]
        body = []
        for c in result["cells"]:
            row = [f"{c['length']:,}", c["n_pairs"]]
            for lab in labels:
                s = c[lab]
                row.append(s["status"] if s["status"] != "ok" else
                           f"{pct(s['correct'], s['n'])} [{100 * s['ci'][0]:.1f}, {100 * s['ci'][1]:.1f}]")
            if cached:
                kv = [c[lab]["stored_bytes"] for lab in labels]
                row += ["-" if b is None else f"{b['stored_prefill'] / KIB:,.1f} / {b['stored_end'] / KIB:,.1f}"
                        for b in kv]
            if len(labels) == 2 and c["paired"] is None:
                row += ["-", "-"]
            elif len(labels) == 2:
                a, b = (c[lab]["acc"] for lab in labels)
                row += [f"{100 * (b - a):+.1f} pp", fmt_p(c["paired"]["p"])]
            body.append(row)
        n_queries = result.get("n_queries")
        asked = "every pair asked" if n_queries is None else f"at most {n_queries} queries per item"
        setting = f"mode: {result['mode']}"
        if cached:
            setting += f", policy: {result['policy'] or 'model default'}, budget: {result['budget'] or 'model default'}"
        return (f"## Multi-query associative recall (MQAR)\n\n{markdown(head, body)}\n"
                f"{setting}; {result['n_items']} items per cell ({asked}; k/n counts queries); "
                f"seed {result['seed']}, alpha {result['alpha']}. A query is correct when the argmax over "
                "the whole vocabulary at the query key is its value (query region teacher-forced)."
                + (" Stored KV bytes per item, at the end of the prefill / after the last query token."
                   if cached else "")
                + "\n")

    def plots(self, result: dict, out_dir: Path) -> list[str]:
        return [mqar_accuracy(result, out_dir / "mqar_accuracy.png")]


def mqar_accuracy(result: dict, path: Path) -> str:
    """MQAR accuracy vs length (log2 x), one line per (model, number of pairs)."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for lab in result["labels"]:
        for pairs in result["n_pairs"]:
            cells = sorted((c for c in result["cells"] if c["n_pairs"] == pairs), key=lambda c: c["length"])
            ax.plot([c["length"] for c in cells], [c[lab]["acc"] for c in cells], marker="o",
                    label=f"{lab}, {pairs} pairs")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1)
    ax.set_xlabel("item length (tokens)")
    ax.set_ylabel("query accuracy")
    ax.set_title(f"MQAR ({result['mode']})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
