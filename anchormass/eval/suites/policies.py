"""(d) Stage-2 policy study (docs/method.md §6 d): passkey trials at one length under small global budgets.

For each AnchorMass model, every policy x budget cell runs the same n trials (depths x seeds);
results are also split by needle depth (the write-up: only `adaptive` recovers needles at
depth <= 0.7). Standard models have no slot policies and are left out of this suite.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from anchormass.errors import ConfigError
from anchormass.eval.items import DEFAULT_DEPTHS, build_haystack, run_trials, tally, trial_grid
from anchormass.eval.report import markdown, pct, plt, save_figure
from anchormass.eval.suite import EvalContext, Suite
from anchormass.models.config import SLOT_POLICIES


class PoliciesSuite(Suite):
    name = "policies"
    in_all = True
    needs_tokenizer = True

    def applies(self, ctx: EvalContext) -> str | None:
        if not any(m.arch == "anchormass" for m in ctx.models):
            return "the stage-2 policy study needs an AnchorMass model"
        return None

    def check(self, ctx: EvalContext) -> None:
        super().check(ctx)
        self.length = int(self.opt("length", 8192))
        self.budgets = [int(b) for b in self.opt("budgets", [512, 256, 128])]
        self.policies = list(self.opt("policies", list(SLOT_POLICIES)))
        bad = [p for p in self.policies if p not in SLOT_POLICIES]
        if bad or not self.policies or not self.budgets or min(self.budgets) < 4:
            raise ConfigError(f"policies: policies must be from {SLOT_POLICIES} (got {bad or self.policies}) "
                              f"and budgets >= 4 (got {self.budgets})")
        self.depths = [float(d) for d in self.opt("depths", DEFAULT_DEPTHS)]
        self.seeds = [int(s) for s in self.opt("seeds", list(range(6)))]
        self.split = float(self.opt("split_depth", 0.7))
        ctx.check_length("policies", self.length)
        self.hay = build_haystack(self, ctx)
        self.trials = trial_grid([self.length], self.depths, self.seeds, self.opt("phrasing", "plain"),
                                 jitter=bool(self.opt("jitter", True)))
        for t in self.trials:
            self.hay.build(t)

    def run(self, ctx: EvalContext) -> dict:
        cells, items = [], []
        models = [m for m in ctx.models if m.arch == "anchormass"]
        for m in models:
            for budget in self.budgets:
                for policy in self.policies:
                    recs = run_trials(ctx, m, self.hay, self.trials, max_new_tokens=int(self.opt("max_new_tokens", 8)),
                                      batch_size=int(self.opt("batch_size", 1)), policy=policy, budget=budget,
                                      chunk=self.opt("chunk"), desc=f"policies {policy}@{budget}")
                    for r in recs:
                        r.update(policy=policy, budget=budget)
                    items += recs
                    shallow = [r for r in recs if r["depth"] <= self.split]
                    cells.append({"model": m.label, "policy": policy, "budget": budget,
                                  "hits": tally(recs)["exact"], "n": len(recs), "oom": tally(recs)["oom"],
                                  "hits_shallow": tally(shallow)["exact"], "n_shallow": len(shallow),
                                  "by_depth": {d: tally([r for r in recs if r["depth"] == d]) for d in self.depths}})
        return {"labels": [m.label for m in models], "length": self.length, "budgets": self.budgets,
                "policies": self.policies, "depths": self.depths, "split_depth": self.split, "cells": cells,
                "items": items,
                # a cell that ran out of memory has no score: missing, not 0.0 exact
                "summary": {f"{c['model']}/{c['policy']}@{c['budget']}/exact": c["hits"] / c["n"] for c in cells
                            if c["n"] and not c["oom"]}}

    def report(self, result: dict) -> str:
        out = [f"## Stage-2 policies at {result['length']:,} tokens\n"]
        for lab in result["labels"]:
            cells = {(c["policy"], c["budget"]): c for c in result["cells"] if c["model"] == lab}
            head = ["budget (slots)"] + result["policies"]
            body = [[f"{b}"] + [pct(cells[(p, b)]["hits"], cells[(p, b)]["n"]) for p in result["policies"]]
                    for b in result["budgets"]]
            out.append(f"**{lab}**: all depths\n\n{markdown(head, body)}")
            body = [[f"{b}"] + [pct(cells[(p, b)]["hits_shallow"], cells[(p, b)]["n_shallow"])
                                for p in result["policies"]] for b in result["budgets"]]
            out.append(f"**{lab}**: needle depth ≤ {result['split_depth']}\n\n{markdown(head, body)}")
            head = ["policy @ budget"] + [f"depth {d:g}" for d in result["depths"]]
            body = [[f"{p} @ {b}"] + [pct(cells[(p, b)]["by_depth"][d]["exact"],
                                                 cells[(p, b)]["by_depth"][d]["n"])
                                      for d in result["depths"]] for b in result["budgets"] for p in result["policies"]]
            out.append(f"**{lab}**: by depth\n\n{markdown(head, body)}")
        return "\n".join(out)

    def plots(self, result: dict, out_dir: Path) -> list[str]:
        return [policy_bars(result, out_dir / "policies.png")]


def policy_bars(result: dict, path: Path) -> str:
    """Exact-match rate per stage-2 policy (bars) at each budget (groups), one panel per model."""
    labels, policies, budgets = result["labels"], result["policies"], result["budgets"]
    fig, axes = plt.subplots(1, len(labels), figsize=(2.2 * len(budgets) * len(labels) + 2, 4), squeeze=False)
    width = 0.8 / len(policies)
    for ax, lab in zip(axes[0], labels):
        cells = {(c["policy"], c["budget"]): c for c in result["cells"] if c["model"] == lab}
        for k, pol in enumerate(policies):
            rates = [cells[(pol, b)]["hits"] / max(1, cells[(pol, b)]["n"]) if (pol, b) in cells else np.nan
                     for b in budgets]
            ax.bar(np.arange(len(budgets)) + k * width, rates, width, label=pol)
        ax.set_xticks(np.arange(len(budgets)) + 0.4 - width / 2, [f"{b} slots" for b in budgets])
        ax.set_ylim(0, 1)
        ax.set_ylabel("passkey exact match")
        ax.set_title(f"stage-2 policies at {result['length']:,} tokens: {lab}")
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize=8)
    return save_figure(fig, path)
