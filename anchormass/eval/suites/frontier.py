"""Recall against stored KV bytes: the recall-memory frontier (docs/method.md §6 h).

On identical items at every length -- the passkey suite's prompts and MQAR items (data/mqar.py) --
each method runs through its inference cache and is charged the stored KV bytes it keeps after
the last token (`cache.stored_nbytes`, per sequence):
- AnchorMass with its own cache (level "full": the model's slot budget) and at each slot budget
  of `slot_budgets` with each slot policy of `slot_policies`;
- Standard with its full cache, and with each KV policy of `kv_policies` at every budget level,
  its per-head token budget matched to the stored bytes of AnchorMass at that level (with the
  first slot policy, the reference), exactly as `suite=baselines` matches them.

A recall score is exact match for passkey trials and per-query accuracy for MQAR. Every cell keeps
its outcomes per item (per query for MQAR), so McNemar pairs AnchorMass (reference policy) with
each Standard variant on identical items, and several training seeds pool into one frontier:
`RecallFrontierSuite.aggregate` gives mean ± std over seeds, a Wilson 95% interval of the pooled
count, and McNemar over the pooled pairs (seed, item, query).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from anchormass.cache.kv_policies import POLICIES as KV_POLICIES
from anchormass.cache.slot_policies import POLICIES as SLOT_POLICIES
from anchormass.data.mqar import MQARVocab, check_shape, make_item
from anchormass.errors import ConfigError
from anchormass.eval.items import passkey_setup, score_answer
from anchormass.eval.report import KIB, fmt_p, markdown, mcnemar_exact, plt, save_figure, wilson_interval
from anchormass.eval.scoring import (
    Method,
    cached_predictions,
    matched_budget,
    prefill_chunk,
    progress,
    session_decode,
    standard_bytes_per_token,
)
from anchormass.eval.suite import EvalContext, Suite

TASKS = ("passkey", "mqar")


def method_key(row: dict) -> tuple:
    return row["task"], row["length"], row["level"], row["method"]


class RecallFrontierSuite(Suite):
    name = "recall_frontier"
    needs_tokenizer = True

    def applies(self, ctx: EvalContext) -> str | None:
        archs = sorted(m.arch for m in ctx.models)
        if archs != ["anchormass", "standard"]:
            return f"the recall frontier compares a Standard and an AnchorMass model; got {archs}"
        return None

    # --------------------------------------------------------------- config
    def check(self, ctx: EvalContext) -> None:
        super().check(ctx)
        why = self.applies(ctx)
        if why:
            raise ConfigError(f"recall_frontier: {why}")
        self.standard = next(m for m in ctx.models if m.arch == "standard")
        self.anchormass = next(m for m in ctx.models if m.arch == "anchormass")
        self.lengths = [int(L) for L in self.opt("lengths", [512, 1024])]
        self.levels = [int(b) for b in self.opt("slot_budgets", [128, 64])]
        self.slot_policies = [str(p) for p in self.opt("slot_policies", list(SLOT_POLICIES))]
        self.kv_policies = [str(p) for p in self.opt("kv_policies", list(KV_POLICIES))]
        for names, registry, what in ((self.slot_policies, SLOT_POLICIES, "slot_policies"),
                                      (self.kv_policies, KV_POLICIES, "kv_policies")):
            unknown = [p for p in names if p not in registry]
            if unknown or not names:
                raise ConfigError(f"recall_frontier.{what}: unknown or empty {unknown or names}; "
                                  f"choose from {sorted(registry)}")
        if not self.lengths or not self.levels or min(self.levels) < 1:
            raise ConfigError("recall_frontier: lengths and slot_budgets must be non-empty, budgets positive")
        self.batch_size = int(self.opt("batch_size", 5))
        self.chunk = self.opt("chunk")
        for L in self.lengths:
            ctx.check_length(self.name, L)
        # passkey: the passkey suite's haystack and trials
        self.hay, trials, self.new_tokens = passkey_setup(self.name, dict(self.opt("passkey") or {}), ctx,
                                                          self.lengths)
        self.trials = {L: [t for t in trials if t.length == L] for L in self.lengths}
        # mqar: token-space items, identical for both models
        mq = dict(self.opt("mqar") or {})
        self.vocab = MQARVocab.from_config(mq.get("vocab") or {})
        for m in ctx.models:
            try:
                self.vocab.check_fits(m.config.vocab_size)
            except ConfigError as err:
                raise ConfigError(f"recall_frontier: model '{m.label}': {err}") from None
        self.n_pairs = int(mq.get("n_pairs", 16))
        self.n_queries = int(mq.get("n_queries") or self.n_pairs)
        self.mqar_alpha = float(mq.get("alpha", 0.0))
        n_items, seed = int(mq.get("n_items", 10)), int(mq.get("seed", 0))
        for L in self.lengths:
            check_shape(self.vocab, L, self.n_pairs, self.n_queries, self.mqar_alpha)
        self.items = {L: [make_item(self.vocab, L, self.n_pairs, self.n_queries, seed, i, self.mqar_alpha)
                          for i in range(n_items)] for L in self.lengths}

    # --------------------------------------------------------------- running
    def _batches(self, method: Method, items: list, ids_of, score) -> tuple[list[dict], float]:
        """Runs `items` through the method's cache in batches: ids_of(batch) -> prompt ids, and
        score(batch, model, ids) -> (outcomes, session bytes). Returns every outcome and the mean
        stored bytes per sequence after the last token."""
        out, stored = [], []
        device = next(method.model.model.parameters()).device
        for s in range(0, len(items), self.batch_size):
            batch = items[s:s + self.batch_size]
            outcomes, kv = score(batch, torch.tensor(ids_of(batch), dtype=torch.long, device=device))
            out += outcomes
            stored.append(kv.stored_end / len(batch))
        return out, float(np.mean(stored))

    def _passkey(self, method: Method, length: int) -> tuple[list[dict], float]:
        """Exact match per trial (greedy decoding of `new_tokens`)."""
        tok = self.hay.tok

        def score(batch, ids):
            chunk = prefill_chunk(self.chunk, method.model)
            new, kv = session_decode(method.model.model, ids, self.new_tokens, chunk, method.policy, method.budget,
                                     vocab_limit=tok.vocab_size)
            return [{"item": f"d{t.depth}/s{t.seed}", "correct": bool(score_answer(tok.decode(row), t.key)["exact"])}
                    for t, row in zip(batch, new.tolist())], kv

        return self._batches(method, self.trials[length], lambda b: [self.hay.build(t) for t in b], score)

    def _mqar(self, method: Method, length: int) -> tuple[list[dict], float]:
        """Argmax accuracy per query (the value after each query key)."""
        positions = self.items[length][0].query_pos  # every item of a length shares the layout

        def score(batch, ids):
            pred, kv = cached_predictions(method.model.model, ids, batch[0].context_len, positions,
                                          prefill_chunk(self.chunk, method.model), method.policy, method.budget)
            return [{"item": f"{it.index}/q{q}", "correct": bool(p == v)}
                    for it, row in zip(batch, pred.tolist()) for q, (p, v) in enumerate(zip(row, it.values))], kv

        return self._batches(method, self.items[length], lambda b: [it.ids for it in b], score)

    def _fed(self, task: str) -> int:
        """Tokens fed after the prefill (SnapKV keeps them all on top of its budget)."""
        return max(0, self.new_tokens - 1) if task == "passkey" else 2 * self.n_queries - 1

    def run(self, ctx: EvalContext) -> dict:
        per_token = standard_bytes_per_token(self.standard.model)
        kv_objs = {p: KV_POLICIES[p]() for p in self.kv_policies}
        rows: list[dict] = []
        cells = [(task, L) for L in self.lengths for task in TASKS]
        for task, L in progress(cells, ctx.progress, "recall frontier"):
            run_one = self._passkey if task == "passkey" else self._mqar

            def record(method: Method, target: float | None = None, note: str | None = None) -> dict:
                outcomes, stored = run_one(method, L)
                k = sum(o["correct"] for o in outcomes)
                row = {"task": task, "length": L, "level": method.level, "method": method.name,
                       "budget": method.budget, "stored": stored, "target": target, "note": note,
                       "k": k, "n": len(outcomes), "outcomes": [o["correct"] for o in outcomes],
                       "ids": [o["item"] for o in outcomes]}
                rows.append(row)
                return row

            record(Method("standard/full", self.standard))
            record(Method("anchormass/full", self.anchormass))
            for level in self.levels:
                ref = None
                for p in self.slot_policies:
                    row = record(Method(f"anchormass/{p}", self.anchormass, p, level, str(level)))
                    ref = ref or row
                target = ref["stored"]
                for name, policy in kv_objs.items():
                    budget, note = matched_budget(policy, target / per_token, self._fed(task))
                    record(Method(f"standard/{name}", self.standard, policy, budget, str(level)), target, note)
        for r in rows:
            r["rate"] = r["k"] / r["n"] if r["n"] else float("nan")
        summary = {f"{r['task']}/L{r['length']}/{r['level']}/{r['method']}": r["rate"] for r in rows}
        return {"settings": {"lengths": self.lengths, "slot_budgets": self.levels, "slot_policies": self.slot_policies,
                             "kv_policies": self.kv_policies, "reference_policy": self.slot_policies[0],
                             "standard_bytes_per_token": per_token, "passkey_trials": len(self.trials[self.lengths[0]]),
                             "mqar": {"n_pairs": self.n_pairs, "n_queries": self.n_queries, "alpha": self.mqar_alpha,
                                      "n_items": len(self.items[self.lengths[0]])},
                             "standard": self.standard.label, "anchormass": self.anchormass.label},
                "rows": rows, "summary": summary}

    # --------------------------------------------------------------- results
    def _pooled(self, result: dict) -> dict:
        """One seed's frontier through `aggregate`, computed once for report() and plots()."""
        if getattr(self, "_pooled_for", None) is not result:
            self._pooled_for, self._pooled_once = result, self.aggregate([result], [None])
        return self._pooled_once

    def report(self, result: dict) -> str:
        return self._pooled(result)["markdown"]

    def plots(self, result: dict, out_dir: Path) -> list[str]:
        return self._pooled(result)["plots"](out_dir)

    @classmethod
    def aggregate(cls, results: list[dict], seeds: list) -> dict:
        """Pool per-seed results (identical settings) into one frontier: per (task, length, level,
        method) the mean ± std of the per-seed rates, the Wilson 95% interval of the pooled count,
        mean stored bytes, and McNemar of the reference AnchorMass policy against each Standard
        variant over the pooled (seed, item) pairs."""
        settings = results[0]["settings"]
        pooled: dict[tuple, dict] = {}
        for seed, res in zip(seeds, results):
            for r in res["rows"]:
                p = pooled.setdefault(method_key(r), {"task": r["task"], "length": r["length"], "level": r["level"],
                                                      "method": r["method"], "rates": [], "stored": [], "k": 0,
                                                      "n": 0, "pairs": {}, "notes": set()})
                p["rates"].append(r["rate"])
                p["stored"].append(r["stored"])
                p["k"] += r["k"]
                p["n"] += r["n"]
                p["pairs"].update({(seed, i): c for i, c in zip(r["ids"], r["outcomes"])})
                if r.get("note"):
                    p["notes"].add(r["note"])
        ref = f"anchormass/{settings['reference_policy']}"
        rows = []
        for key, p in pooled.items():
            lo, hi = wilson_interval(p["k"], p["n"])
            row = {k: p[k] for k in ("task", "length", "level", "method", "k", "n")}
            row.update(mean=float(np.mean(p["rates"])), std=float(np.std(p["rates"], ddof=1)) if len(p["rates"]) > 1
                       else float("nan"), ci=[lo, hi], stored=float(np.mean(p["stored"])), seeds=len(p["rates"]),
                       notes=sorted(p["notes"]))
            if row["method"].startswith("standard/"):
                other = pooled.get((row["task"], row["length"], row["level"],
                                    "anchormass/full" if row["level"] == "full" else ref))
                if other is not None:
                    common = sorted(set(p["pairs"]) & set(other["pairs"]), key=str)
                    row["mcnemar_vs_anchormass"] = mcnemar_exact([other["pairs"][c] for c in common],
                                                                 [p["pairs"][c] for c in common])
            rows.append(row)
        return {"markdown": _markdown(rows, settings, seeds), "json": {"settings": settings, "rows": rows},
                "plots": lambda out_dir: [frontier_plot(rows, Path(out_dir) / "recall_frontier.png")]}


def _fmt_rate(r: dict) -> str:
    spread = "" if np.isnan(r["std"]) else f" ± {100 * r['std']:.1f}"
    return f"{100 * r['mean']:.1f}{spread}% [{100 * r['ci'][0]:.0f}, {100 * r['ci'][1]:.0f}] ({r['k']}/{r['n']})"


def _markdown(rows: list[dict], settings: dict, seeds: list) -> str:
    n_seeds = len(seeds)
    order = {"full": -1}
    text = ["## Recall vs stored KV bytes (recall-memory frontier)\n"]
    for L in settings["lengths"]:
        at = [r for r in rows if r["length"] == L]
        keys = sorted({(r["level"], r["method"]) for r in at},
                      key=lambda k: (order.get(k[0], 0), -int(k[0]) if k[0] != "full" else 0,
                                     not k[1].startswith("anchormass"), k[1]))
        head = ["level", "method", "stored KiB / seq (passkey, MQAR)", "passkey exact", "MQAR accuracy",
                "McNemar p vs AnchorMass (passkey, MQAR)"]
        body = []
        for level, method in keys:
            cell = {r["task"]: r for r in at if r["level"] == level and r["method"] == method}
            pk, mq = cell.get("passkey"), cell.get("mqar")
            stored = ", ".join(f"{c['stored'] / KIB:,.1f}" if c else "-" for c in (pk, mq))
            tests = ", ".join(fmt_p(c["mcnemar_vs_anchormass"]["p"]) if c and "mcnemar_vs_anchormass" in c else "-"
                              for c in (pk, mq))
            body.append([level, method, stored, _fmt_rate(pk) if pk else "-", _fmt_rate(mq) if mq else "-", tests])
        text.append(f"### {L:,} tokens\n\n{markdown(head, body)}")
    mq = settings["mqar"]
    notes = sorted({f"{r['method']} level {r['level']} L={r['length']:,}: {n}" for r in rows for n in r["notes"]})
    text.append(
        f"Rates: mean ± std over {n_seeds} training seed(s), the Wilson 95% interval of the pooled count, (pooled "
        f"hits/n). Passkey: {settings['passkey_trials']} trials per length and seed (the passkey suite's prompts); "
        f"MQAR: {mq['n_items']} items x {mq['n_queries']} queries ({mq['n_pairs']} pairs, alpha {mq['alpha']}). "
        f"Stored = keys, values and masses kept after the last token, per sequence. A level is an AnchorMass slot "
        f"budget; the Standard KV policies get the per-head token budget whose stored bytes equal AnchorMass's with "
        f"the {settings['reference_policy']} policy (measured; a Standard token stores "
        f"{settings['standard_bytes_per_token']:,} B). McNemar (exact, two-sided): each Standard row against "
        f"AnchorMass ({settings['reference_policy']}) at the same level, or AnchorMass's own cache at level full, "
        f"over identical items pooled across seeds.\n")
    if notes:
        text.append("\n".join(f"- {n}" for n in notes) + "\n")
    return "\n".join(text)


def frontier_plot(rows: list[dict], path: Path) -> str:
    """Rows: task; columns: length. Recall (y) against stored KV KiB (x, log): one line per method
    across budget levels; the full caches as stars."""
    lengths = sorted({r["length"] for r in rows})
    methods = sorted({r["method"] for r in rows if not r["method"].endswith("/full")})
    colour = {m: f"C{i}" for i, m in enumerate(methods)}
    fig, axes = plt.subplots(len(TASKS), len(lengths), figsize=(4.2 * len(lengths), 3.6 * len(TASKS)), squeeze=False)
    for i, task in enumerate(TASKS):
        for j, L in enumerate(lengths):
            ax = axes[i][j]
            at = [r for r in rows if r["task"] == task and r["length"] == L]
            for m in methods:
                pts = sorted((r["stored"] / KIB, r["mean"]) for r in at if r["method"] == m)
                if pts:
                    ax.plot(*zip(*pts), marker="o" if m.startswith("anchormass") else "s", ms=4, color=colour[m],
                            ls="-" if m.startswith("anchormass") else "--", label=m)
            for r in at:
                if r["method"].endswith("/full"):
                    ax.plot(r["stored"] / KIB, r["mean"], marker="*", ms=12, ls="none",
                            color="k" if r["method"].startswith("standard") else "C9", label=r["method"])
            ax.set_xscale("log")
            ax.set_ylim(-0.05, 1.05)
            ax.grid(alpha=0.3)
            ax.set_title(f"{task}, {L:,} tokens")
            ax.set_xlabel("stored KV per sequence (KiB, log)")
            if j == 0:
                ax.set_ylabel("passkey exact match" if task == "passkey" else "MQAR accuracy")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return save_figure(fig, path)
