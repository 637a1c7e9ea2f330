"""suite=retrofit over training seeds (anchormass/eval/aggregate.py's hook): the study's table and plots.

Per cell: passkey exact at every length as mean ± sample std over the seeds that trained it and a
Wilson 95% interval of the pooled count; mean digits; exact McNemar against the shape's Standard and
against the shape's lossless g1 cell over the (seed, trial) pairs both answered; stored KV bytes of
one sequence at the trained length; the last answer-token validation loss; the per-layer slot
diagnostics averaged over seeds. A shape's cells are a result only where its Standard reaches the
control bar at every trained length (docs/method.md §6 j); otherwise the table says so.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from anchormass.errors import DataError
from anchormass.eval.report import fmt_p, markdown, mcnemar_exact, scalar_stats, wilson_interval

CONTROL_BAR = 0.8  # a Standard below this at a trained length has not learned the task
TRAINED = (512, 1024, 2048)  # the long-context stages' lengths: where the control must recall


def _role(info: dict) -> str:
    if info["arch"] == "standard":
        return "standard"
    return "g1" if info["group_size"] == 1 else "compressed"


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def pool_cells(per_seed: list[dict], seeds: list) -> dict:
    """{label: pooled cell} over the seeds that scored it, in first-seen order."""
    labels = list(dict.fromkeys(lab for r in per_seed for lab in r["labels"]))
    lengths = per_seed[0]["lengths"]
    out = {}
    for lab in labels:
        runs = [(s, r) for s, r in zip(seeds, per_seed) if lab in r["labels"]]
        info = runs[0][1]["models"][lab]
        by_len = {}
        for L in lengths:
            counts = [r["by_length"][lab][str(L)] if str(L) in r["by_length"][lab] else r["by_length"][lab][L]
                      for _, r in runs]
            k, n = sum(c["exact"] for c in counts), sum(c["n"] for c in counts)
            rates = [c["exact"] / c["n"] for c in counts if c["n"]]
            st = scalar_stats(rates) if rates else None
            by_len[L] = {"exact": k, "n": n, "acc": k / n if n else float("nan"), "ci": list(wilson_interval(k, n)),
                         "std": st["std"] if st else None,
                         "digits": _mean(c["digits_mean"] for c in counts)}
        curves = [r["curves"].get(lab) or [] for _, r in runs]
        probes = [r["probe"].get(lab) or [] for _, r in runs]
        layers = [{key: _mean(p[li].get(key) for p in probes if li < len(p))
                   for key in ("digits_kept", "attn_on_needle", "emit")} for li in range(max(map(len, probes)))]
        out[lab] = {"info": info, "seeds": [s for s, _ in runs], "by_length": by_len,
                    "bytes": _mean(r["stored_bytes"][lab] for _, r in runs),
                    "val_loss": _mean(c[-1]["val_loss"] if c else None for c in curves),
                    "curves": curves, "layers": layers}
    return out


SAME_TRIALS = ("lengths", "trained_length", "depths", "seeds", "filler")
PER_CELL = ("models", "by_length", "stored_bytes", "probe", "curves")


def merge_runs(runs: list[dict]) -> dict:
    """One seed's cells scored in several runs (parts of a study that finished at different times)
    as one run. The runs must have scored the same trials; a cell scored in more than one must have
    the same outcome on every trial (checkpoints and greedy decoding are deterministic), else
    something differs between the runs and pooling them would hide it."""
    first = runs[0]
    for run in runs[1:]:
        differ = [k for k in SAME_TRIALS if run.get(k) != first.get(k)]
        if differ:
            raise DataError(f"retrofit: cannot merge runs that scored different trials ({', '.join(differ)} differ)")
    out = {k: first.get(k) for k in SAME_TRIALS}
    out.update({"labels": [], "items": [], "summary": {}, "bytes_length": first.get("bytes_length"),
                **{k: {} for k in PER_CELL}})
    outcome = lambda run, lab: sorted((r["length"], r["depth"], r["seed"], r["exact"], r["digits"])  # noqa: E731
                                      for r in run["items"] if r["model"] == lab)
    for run in runs:
        for lab in run["labels"]:
            if lab in out["labels"]:
                if outcome(run, lab) != outcome(out, lab):
                    raise DataError(f"retrofit: cell {lab} was scored in two runs with different outcomes; "
                                    f"merge runs of the same checkpoints only")
                continue
            out["labels"].append(lab)
            for k in PER_CELL:
                out[k][lab] = run[k].get(lab)
            out["items"] += [r for r in run["items"] if r["model"] == lab]
            out["summary"].update({k: v for k, v in (run.get("summary") or {}).items() if k.startswith(lab + "/")})
    out["left_out"] = list(dict.fromkeys(lab for run in runs for lab in run.get("left_out") or []
                                         if lab not in out["labels"]))
    return out


def paired(per_seed: list[dict], seeds: list, a: str, b: str, length: int) -> dict:
    """Exact McNemar of b against a over the (seed, trial) pairs both answered at `length`."""
    ident = lambda s, r: (s, r["depth"], r["seed"])  # noqa: E731
    xa, xb = {}, {}
    for s, res in zip(seeds, per_seed):
        for r in res["items"]:
            if r["length"] == length and r["model"] in (a, b):
                (xa if r["model"] == a else xb)[ident(s, r)] = r["exact"]
    common = sorted(set(xa) & set(xb), key=str)
    return {**mcnemar_exact([xa[k] for k in common], [xb[k] for k in common]), "pairs": len(common)}


def control_learned(cell: dict) -> bool:
    return all(cell["by_length"][L]["acc"] >= CONTROL_BAR for L in TRAINED if L in cell["by_length"])


def pool_seeds(per_seed: list[dict], seeds: list) -> dict:
    cells = pool_cells(per_seed, seeds)
    trained = int(per_seed[0]["trained_length"])
    shown = [trained, 2 * trained] if 2 * trained in per_seed[0]["lengths"] else [trained]
    shapes = list(dict.fromkeys(c["info"]["shape"] for c in cells.values()))
    refs = {shape: {_role(c["info"]): lab for lab, c in cells.items() if c["info"]["shape"] == shape
                    and _role(c["info"]) != "compressed"} for shape in shapes}
    head = ["shape", "cell", "seeds"] + [f"exact @{L:,} [95% CI]" for L in shown] + [
        f"digits @{shown[-1]:,}", f"stored KiB @{trained:,}", "val answer loss"] + [
        f"p vs {ref} @{L:,}" for ref in ("Standard", "g1") for L in shown]
    body, notes = [], []
    for shape in shapes:
        std = refs[shape].get("standard")
        ok = std is not None and control_learned(cells[std])
        if not ok:
            notes.append(f"- {shape}: the Standard control did not reach {CONTROL_BAR:.0%} at every trained length "
                         f"({', '.join(str(L) for L in TRAINED)}): its cells are no result")
        for lab, c in cells.items():
            if c["info"]["shape"] != shape:
                continue
            row = [shape, lab + ("" if ok else " (control did not learn)"), len(c["seeds"])]
            for L in shown:
                x = c["by_length"][L]
                spread = f" ± {x['std']:.0%}" if x["std"] is not None else ""
                row.append(f"{x['acc']:.0%}{spread} ({x['exact']}/{x['n']}) [{x['ci'][0]:.0%}, {x['ci'][1]:.0%}]")
            row += [f"{c['by_length'][shown[-1]]['digits']:.2f}" if c["by_length"][shown[-1]]["digits"] is not None
                    else "-", f"{c['bytes'] / 1024:.1f}" if c["bytes"] is not None else "-",
                    f"{c['val_loss']:.3f}" if c["val_loss"] is not None else "-"]
            for ref in ("standard", "g1"):
                other = refs[shape].get(ref)
                for L in shown:
                    row.append("-" if other in (None, lab) else fmt_p(paired(per_seed, seeds, other, lab, L)["p"]))
            body.append(row)
    full = ["cell"] + [f"exact @{L:,}" for L in per_seed[0]["lengths"]]
    full_body = [[lab] + [f"{c['by_length'][L]['exact']}/{c['by_length'][L]['n']}" for L in per_seed[0]["lengths"]]
                 for lab, c in cells.items()]
    probe_head = ["cell", "layer", "key digits kept", "attention on needle", "emit rate"]
    probe_body = [[lab, li, _fmt(x["digits_kept"]), _fmt(x["attn_on_needle"]), _fmt(x["emit"])]
                  for lab, c in cells.items() for li, x in enumerate(c["layers"])]
    for seed, res in zip(seeds, per_seed):  # cells the config lists that had no finished run to score
        if res.get("left_out"):
            where = "" if seed is None else f" under seed {seed}"
            notes.append(f"- not scored{where} (no finished run): {', '.join(res['left_out'])}")
    n_trials = len(per_seed[0]["depths"]) * len(per_seed[0]["seeds"])
    text = (f"## Recall against compression, retrofit route\n\n{markdown(head, body)}\n"
            f"{n_trials} passkey trials per length and training seed ({len(per_seed[0]['depths'])} depths x "
            f"{len(per_seed[0]['seeds'])} keys), identical for every cell; ± is the std over training seeds; "
            f"CI: Wilson on the pooled count; p: exact McNemar over (seed, trial) pairs; stored bytes measured "
            f"after prefilling one {trained:,}-token prompt.\n" + "".join(n + "\n" for n in notes)
            + f"\n### Exact matches at every length\n\n{markdown(full, full_body)}\n"
            + f"\n### Slot diagnostics at {trained:,} tokens (stage 1 of one parallel forward)\n\n"
            + markdown(probe_head, probe_body) + "\n")
    plain = {lab: {k: v for k, v in c.items() if k != "curves"} for lab, c in cells.items()}
    return {"markdown": text, "json": {"cells": plain, "shown_lengths": shown},
            "plots": lambda out_dir: plots(cells, shown, Path(out_dir))}


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def plots(cells: dict, shown: list[int], out_dir: Path) -> list[str]:
    from anchormass.eval.suites.retrofit.plots import curves_plot, frontier_plot, heads_plot

    return [frontier_plot(cells, shown, out_dir / "retrofit_frontier.png"),
            heads_plot(cells, shown, out_dir / "retrofit_g8_vs_heads.png"),
            curves_plot(cells, out_dir / "retrofit_curves.png")]
