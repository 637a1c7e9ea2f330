"""suite=slot_recall over training seeds (anchormass/eval/aggregate.py's hook): one study table.

Per cell (task, length) and model: the mean ± sample std of the per-seed accuracies, a Wilson 95%
interval of the pooled count, exact McNemar against the first model over the pooled (seed, item,
question) pairs, the per-layer probes averaged over the seeds, and from the mean learning curve
the first checkpoint step at which held-out recall reaches 50% and 80%. A cell counts as a result
only where the lossless control of the same shape (group_size = 1) reaches 80% (docs/method.md
§6 i): otherwise its row says the budget was too small.
"""

from __future__ import annotations

import numpy as np

from anchormass.errors import ConfigError
from anchormass.eval import tables
from anchormass.eval.aggregate import scalar_stats
from anchormass.eval.common import fmt_p
from anchormass.eval.stats import mcnemar_exact, wilson_interval
from anchormass.eval.suites.slot_recall_format import fmt_share, mean_present, status_text

CONTROL_BAR = 0.8  # a lossless control below this has not learned the task: the cell is no result


def is_lossless(info: dict) -> bool:
    return info["arch"] == "anchormass" and info.get("group_size") == 1


def shape_of(info: dict) -> str:
    return f"{info['n_layers']}L x {info['head_dim']}d"


def mean_curves(per_seed: list[dict], label: str) -> dict[str, list[tuple[int, float]]]:
    """{cell: [(step, mean acc over the seeds that have that step)]}."""
    acc: dict[str, dict[int, list[float]]] = {}
    for res in per_seed:
        for point in (res.get("curves") or {}).get(label, []):
            for cell, r in point["cells"].items():
                acc.setdefault(cell, {}).setdefault(point["step"], []).append(r["acc"])
    return {cell: [(s, float(np.mean(v))) for s, v in sorted(steps.items())] for cell, steps in acc.items()}


def first_step(curve: list[tuple[int, float]], bar: float) -> int | None:
    return next((s for s, a in curve if a >= bar), None)


def pool_seeds(per_seed: list[dict], seeds: list[int]) -> dict:
    # A model trained under only some seeds (the study's one-seed cells) is pooled over those seeds, and
    # says how many; pairs with another model are the (seed, item, question) triples both answered.
    labels = list(dict.fromkeys(lab for r in per_seed for lab in r["labels"]))
    if not all(labels[0] in r["labels"] for r in per_seed):
        raise ConfigError(f"slot_recall aggregate: the first model, {labels[0]}, must be scored under every seed")
    models = {k: v for r in reversed(per_seed) for k, v in r["models"].items()}
    cells = []
    for ci, cell in enumerate(per_seed[0]["cells"]):
        key = f"{cell['task']}/{cell['length']}"
        row = {"task": cell["task"], "length": cell["length"]}
        pairs = {lab: {} for lab in labels}
        for seed, res in zip(seeds, per_seed):
            for r in res["items"]:
                if f"{r['task']}/{r['length']}" == key and r["model"] in pairs:
                    pairs[r["model"]][(seed, r["item"], r["query"])] = r["correct"]
        for lab in labels:
            per = [res["cells"][ci][lab] for res in per_seed if lab in res["labels"]]
            k, n = sum(p["correct"] for p in per), sum(p["n"] for p in per)
            n_layers = len(per[0].get("layers") or [])
            layers = [{m: mean_present(p["layers"][li][m] for p in per) for m in ("attn", "emit", "all_kept")}
                      | {"status": {s: mean_present(p["layers"][li]["status"].get(s, 0.0) for p in per)
                                    for s in per[0]["layers"][li]["status"]}} for li in range(n_layers)]
            common = sorted(set(pairs[labels[0]]) & set(pairs[lab]))
            curve = mean_curves(per_seed, lab).get(key, [])
            row[lab] = {"acc": scalar_stats([p["acc"] for p in per]), "correct": k, "n": n, "n_seeds": len(per),
                        "recall_free": mean_present(p.get("recall_free") for p in per),
                        "ci": list(wilson_interval(k, n)), "layers": layers,
                        "paired": None if lab == labels[0] else mcnemar_exact(
                            [pairs[labels[0]][x] for x in common], [pairs[lab][x] for x in common]),
                        "curve": curve, "step_50": first_step(curve, 0.5), "step_80": first_step(curve, CONTROL_BAR)}
        for lab in labels:  # the lossless control of the same shape decides whether the cell is a result
            controls = [c for c in labels if is_lossless(models[c]) and shape_of(models[c]) == shape_of(models[lab])]
            row[lab]["control_learned"] = (None if not controls else
                                           all(row[c]["correct"] / max(1, row[c]["n"]) >= CONTROL_BAR
                                               for c in controls))
            # AnchorMass against each control of its shape (Standard twin, lossless slots) on identical questions
            twins = [c for c in labels if c != lab and shape_of(models[c]) == shape_of(models[lab])
                     and (models[c]["arch"] == "standard" or is_lossless(models[c]))]
            row[lab]["vs_controls"] = {} if models[lab]["arch"] != "anchormass" or is_lossless(models[lab]) else {
                c: mcnemar_exact(*zip(*[(pairs[lab][x], pairs[c][x]) for x in sorted(set(pairs[lab]) & set(pairs[c]))]))
                for c in twins}
        cells.append(row)
    return {"markdown": pooled_markdown(labels, models, cells, seeds),
            "json": {"labels": labels, "models": models, "cells": cells, "seeds": list(seeds)},
            "plots": lambda out_dir: _plots(labels, models, cells, out_dir)}


def pooled_markdown(labels, models, cells, seeds) -> str:
    head = ["task", "shape", "model", "acc mean ± std", "pooled [95% CI]", "recall-free", f"vs {labels[0]}: b/c (p)",
            "answer copies outlier / anchor / averaged %", "all kept (last layer)", "attention on fact",
            "emit rate", "steps to 50% / 80%", "result?", "vs its shape's controls: b/c (p)"]
    body = []
    for c in cells:
        for lab in labels:
            s = c[lab]
            acc = s["acc"]
            std = "-" if acc["std"] is None else f"{100 * acc['std']:.1f}"
            layers = s["layers"]
            verdict = {None: "no control", True: "yes", False: "no: control < 80%"}[s["control_learned"]]
            body.append([c["task"], shape_of(models[lab]), lab,
                         f"{100 * acc['mean']:.1f} ± {std}"
                         + (f" ({s['n_seeds']} seed)" if s["n_seeds"] < len(seeds) else ""),
                         f"{tables.pct(s['correct'], s['n'])} [{100 * s['ci'][0]:.1f}, {100 * s['ci'][1]:.1f}]",
                         fmt_share(s.get("recall_free")),
                         ("-" if s["paired"] is None
                          else f"{s['paired']['b']}/{s['paired']['c']} ({fmt_p(s['paired']['p'])})"),
                         status_text(layers), fmt_share(layers[-1]["all_kept"]) if layers else "-",
                         fmt_share(mean_present(lay["attn"] for lay in layers)),
                         fmt_share(mean_present(lay["emit"] for lay in layers)),
                         f"{s['step_50'] if s['step_50'] is not None else '-'} / "
                         f"{s['step_80'] if s['step_80'] is not None else '-'}", verdict,
                         "; ".join(f"{c}: {m['b']}/{m['c']} ({fmt_p(m['p'])})" for c, m in s["vs_controls"].items())
                         or "-"])
    return ("## Recall through slots over training seeds\n\n" + tables.markdown(head, body) +
            f"\nseeds {', '.join(map(str, seeds))}; acc mean ± std over the seeds (percent; a model trained under "
            "fewer seeds says how many), pooled Wilson interval, recall-free = the rate of guessing each answer token "
            "among the distinct answer-type ids in the context (no recall), "
            f"exact McNemar against {labels[0]}, and of each AnchorMass model against the Standard twin and the "
            "lossless control of its shape (b: the model right, the control wrong), over the pooled (seed, item, "
            "question) pairs; probes averaged over "
            "seeds and layers; steps to 50% / 80% from the mean held-out learning curve (periodic checkpoints). "
            "result? = the lossless control (group_size=1) of the same shape reached 80% on the task; "
            "otherwise the budget was too small and the row is no finding.\n")


def _plots(labels, models, cells, out_dir) -> list[str]:
    from anchormass.eval.suites.slot_recall_plots import pooled_curves, recall_by_model

    flat = [{"task": c["task"], "length": c["length"],
             **{lab: {"acc": c[lab]["correct"] / max(1, c[lab]["n"]), "ci": c[lab]["ci"]} for lab in labels}}
            for c in cells]
    out = [recall_by_model(labels, flat, out_dir / "slot_recall_by_model.png",
                           shapes={lab: shape_of(models[lab]) for lab in labels})]
    if any(c[lab]["curve"] for c in cells for lab in labels):
        out.append(pooled_curves(labels, cells, out_dir / "slot_recall_curves.png"))
    return out
