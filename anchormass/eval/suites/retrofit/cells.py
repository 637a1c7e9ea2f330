"""What the retrofit suite measures of one cell besides its passkey trials: what the cell is, the
stored KV bytes of one sequence, what stage 1 kept of the key's digits, and its learning curve."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import torch

from anchormass.eval.suite import EvalModel
from anchormass.eval.suites.retrofit.slot_probe import KEPT, LayerView, probe_forward
from anchormass.runs.layout import result_file, run_of_checkpoint, stage_args_file


def cell_info(m: EvalModel, cell: dict) -> dict:
    c = m.config
    return {"shape": str(cell["shape"]), "arch": c.arch, "group_size": c.group_size if c.arch == "anchormass" else None,
            "outliers": c.outliers if c.arch == "anchormass" else None, "n_layers": c.n_layers,
            "n_global_heads": c.n_global_heads if c.arch == "anchormass" else c.n_heads, "head_dim": c.head_dim,
            "global_heads_total": c.n_layers * (c.n_global_heads if c.arch == "anchormass" else c.n_heads),
            "source": m.source, "run": str(cell["run"]), "tags": [str(t) for t in cell.get("tags") or []]}


@torch.no_grad()
def stored_bytes(model, prompt: list[int], chunk: int = 256) -> int:
    """Measured bytes of the keys, values and masses the cache keeps after prefilling `prompt`
    (anchormass/cache/base.py: stored_nbytes), in chunks as generation prefills."""
    from anchormass.cache import new_cache

    ids = torch.tensor([prompt], dtype=torch.long, device=next(model.parameters()).device)
    cache = new_cache(model, 1)
    for piece in ids.split(chunk, dim=1):
        model(piece, cache=cache)
    return int(cache.stored_nbytes)


def digit_positions(hay, trial, tokenizer) -> list[int]:
    """Prompt positions of the needle's tokens that carry a digit of the key."""
    lo, hi = hay.needle_span(trial)
    ids = hay.build(trial)
    return [p for p in range(lo, hi) if any(ch.isdigit() for ch in tokenizer.decode([ids[p]]))]


@torch.no_grad()
def slot_diagnostics(model, hay, trials, tokenizer) -> list[dict]:
    """Per layer, over the trials: the share of the key's digit tokens whose own key reached the
    global heads (outlier, anchor, exact or raw: anchormass/eval/suites/retrofit/slot_probe.py), the attention mass
    the answering query (the prompt's last token) puts on the needle, and the outlier emit rate."""
    per_layer: list[dict[str, list]] = []
    for t in trials:
        ids = hay.build(t)
        query = len(ids) - 1
        _, qkv = probe_forward(model, torch.tensor([ids], device=next(model.parameters()).device), [query])
        lo, hi = hay.needle_span(t)
        digits = digit_positions(hay, t, tokenizer)
        for li, layer in enumerate(qkv):
            view = LayerView(model.cfg, layer)
            if len(per_layer) <= li:
                per_layer.append({"kept": [], "attn": [], "emit": []})
            rec = per_layer[li]
            rec["kept"] += [view.status(0, p, query) in KEPT for p in digits]
            rec["attn"].append(view.attention_on(0, query, lo, hi))
            emit = view.emit_rate(0)
            if emit is not None:
                rec["emit"].append(emit)
    return [{"digits_kept": float(np.mean(r["kept"])) if r["kept"] else None,
             "attn_on_needle": float(np.mean(r["attn"])), "emit": float(np.mean(r["emit"])) if r["emit"] else None,
             "n_trials": len(trials)} for r in per_layer]


def chain_folders(run: Path) -> list[Path]:
    """The run folders of one model's chain, first to last: each stage's stage_args.json names the
    checkpoint it started from (anchormass/curriculum/execute.py); the chain stays in the model's folder."""
    chain = [run]
    while True:
        record = stage_args_file(chain[0])
        start = json.loads(record.read_text(encoding="utf-8")).get("init_from") if record.is_file() else None
        parent = run_of_checkpoint(start) if start else None
        if parent is None or parent.parent.name != run.parent.name or parent in chain:
            return chain
        chain.insert(0, parent)


def learning_curve(run: Path) -> list[dict]:
    """Answer-token validation loss against steps over the cell's chain of stages (steps counted
    from the chain's first stage), read from each stage's metrics.csv."""
    points, offset = [], 0
    for folder in chain_folders(run):
        rows = []
        for path in sorted(folder.rglob("metrics.csv")):
            with open(path, newline="", encoding="utf-8") as fh:
                rows += [r for r in csv.DictReader(fh) if r.get("val/loss") not in (None, "")]
        last = 0
        for r in sorted(rows, key=lambda r: int(float(r["step"]))):
            step = int(float(r["step"])) + 1
            loss = float(r["val/loss"])
            if math.isfinite(loss):
                points.append({"stage": folder.name, "step": offset + step, "val_loss": loss})
            last = max(last, step)
        result = result_file(folder)
        total = json.loads(result.read_text(encoding="utf-8")).get("total_steps") if result.is_file() else None
        offset += int(total or last)
    return points
