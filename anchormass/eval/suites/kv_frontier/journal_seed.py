"""The rows of an earlier kv_frontier report (its results.json), keyed as the journal keys them.

The journal (`<work_dir>/rows.jsonl`) lives in an ignored folder, so a fresh clone has none; the
committed report holds the same rows. `journal_from:` hands them back to the suite, which takes a
row only where the report's settings hash to its own (same weights, passkey, new tokens, policy
arguments, probe and prefill chunk at that length), so nothing measured otherwise is reused.

The weights are named by a checksum of the tensors themselves (`weights_key`), not of the checkpoint
file: an import written again at another commit records another commit in its file, and holds the
same weights. A report from before the key was recorded names only its file's checksum; its model
is taken to be this one when the retrieval probe, recomputed on these weights, gives the report's
scores (`same_probe`): every layer's attention on the probe's prompts, measured, not assumed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from anchormass.errors import ConfigError

PROBE_TOLERANCE = 1e-6  # the largest difference of a retrieval score that still names the same weights


def weights_key(model: torch.nn.Module) -> str:
    """A checksum of the model's tensors (names, dtypes, shapes, values), independent of the file."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]


def same_probe(report_scores: list, scores: torch.Tensor) -> bool:
    """Does the report's retrieval probe equal the one measured here (same shape, every score within
    PROBE_TOLERANCE)?"""
    theirs = torch.tensor(report_scores, dtype=scores.dtype)
    return theirs.shape == scores.shape and bool((theirs - scores).abs().max() <= PROBE_TOLERANCE)


def row_key(length: int, method: str, level: str, checkpoint: str | None = None) -> str:
    """The journal key of a passkey row; the suite keys its rows here and so does a report's seeding.
    A trained cell is keyed by its checkpoint's short checksum (a retrained cell is scored again)."""
    from anchormass.eval.suites.kv_frontier import FULL  # the package imports this module first

    if method == FULL:
        return f"{length}/{FULL}"
    if method.startswith("kvpress/"):
        return f"{length}/{level}/{method}"
    if method.startswith("ours/"):
        return f"{length}/{level}/{method.removeprefix('ours/')}"
    if method.startswith("trained/"):
        return f"{length}/{method}/{checkpoint}"
    return f"{length}/{method}"  # an AnchorMass cell made from the weights: its label is its level


def ppl_key(anchors_key: str, length: int, method: str, checkpoint: str | None = None) -> str:
    """The journal key of one method's perplexity at one length (prior context + target)."""
    return f"ppl/{anchors_key}/{length}/{method}" + (f"/{checkpoint}" if checkpoint else "")


def _row_key(row: dict) -> str | None:
    """A report row's journal key (None: a trained cell's row from before rows named their checkpoint)."""
    if row["method"].startswith("trained/") and not row.get("checkpoint"):
        return None
    return row_key(row["length"], row["method"], row["level"], row.get("checkpoint"))


def _ppl_rows(ppl: dict, now: dict | None) -> list[tuple[str, dict]]:
    """Perplexity rows, keyed by the anchors' key. A report written before the key was recorded is
    used only where its anchors, target length and token file's path are the current run's."""
    key = ppl.get("key")
    if key is None:
        same = now is not None and all(ppl.get(k) == now[k] for k in ("anchors", "target_len", "data"))
        if not same:
            return []
        key = now["key"]
    own = ppl.get("trained_sha256", {})  # a trained cell's checkpoint, by its short checksum
    out = []
    for method, by_context in ppl["nll"].items():
        if method.startswith("trained/") and method not in own:
            continue  # no checkpoint checksum to key it by
        for context, nll in by_context.items():
            out.append((ppl_key(key, int(context) + ppl["target_len"], method, own.get(method)), {"nll": nll}))
    return out


def rope_setting(rope_scaling: str) -> dict:
    """The RoPE scaling past the trained length, as the row settings hold it: absent for the default
    (NTK), so rows measured before the choice existed keep their keys."""
    return {} if rope_scaling == "ntk" else {"rope_scaling": rope_scaling}


def report_rows(path: Path, ppl_now: dict | None, weights: str,
                scores: torch.Tensor) -> tuple[dict, int, list[tuple[str, dict]]]:
    """(the report's row settings, its prefill chunk, [(journal key, row)]) of a results.json; its
    model is `weights` when it records that key, or records none and its probe equals `scores`."""
    try:
        report = json.loads(Path(path).read_text())
        result = report["suites"]["kv_frontier"]
        kv = report["config"]["eval"]["kv_frontier"]
        model = result["settings"].get("weights")
        if model is None and same_probe(result["settings"]["retrieval_scores"], scores):
            model = weights
        settings = {"model": model or report["models"][0]["sha256"], "passkey": kv.get("passkey"),
                    "new_tokens": result["settings"]["new_tokens"], "policy_args": kv.get("policy_args"),
                    "probe": dict(kv.get("probe") or {}), "rope_scaling": str(kv.get("rope_scaling") or "ntk")}
        chunk = int(result["settings"]["chunk"])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        raise ConfigError(f"kv_frontier.journal_from: {path} is not a kv_frontier results.json ({e})") from None
    found = [("probe", {"scores": result["settings"]["retrieval_scores"]})]
    found += [(key, row) for row in result["rows"] if (key := _row_key(row)) is not None]
    if result.get("ppl"):
        found += _ppl_rows(result["ppl"], ppl_now)
    return settings, chunk, found
