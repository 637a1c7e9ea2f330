"""Recall against stored KV bytes for one Standard model's weights, without training (docs/method.md §6 k).

On identical passkey prompts (the passkey suite's trials, needles jittered) every method decodes
greedily through its own cache and is charged the bytes it stores after the last token:
- the full cache;
- AnchorMass made from the same weights (variants.py): `shares` global KV groups per layer,
  chosen by a measured retrieval score or by index, at each group size, outlier slots on or off;
  each point carries its measured tokens per global slot (its real merge ratio);
- our SnapKV, H2O and StreamingLLM (docs/method.md §3) at the per-KV-head token budget whose
  stored bytes equal each distinct AnchorMass point's;
- kvpress's presses on the same weights (peer.py), at the compression ratio that keeps as many
  prompt tokens as our policies do at that point;
- AnchorMass checkpoints trained from these weights (`trained: {<label>: <ckpt>}`, the retrofit
  cells of docs/method.md §6 l), on the same trials, each at the bytes it stores.
Per method and length: exact match with its Wilson interval, digits, exact McNemar against the full
cache on the same trials, and for a press that is ours under another implementation, the per-item
agreement of the two. Finished rows are appended to `<work_dir>/rows.jsonl` as they finish, so an
interrupted run continues where it stopped (a row is reused only under the same settings; inside a
row, so is each finished batch of its trials, from `<work_dir>/partial.jsonl`), and
`journal_from: [<results.json>, ...]` lets a fresh clone continue from committed reports (journal_seed.py).
Past the trained length `rope_scaling: ntk` (the default) runs every method with the project's NTK
scaling; `none` runs plain RoPE, the model `transformers`' Llama is there. kvpress runs under either:
under NTK it gets the Llama whose RoPE base is our session's for the prompts' length (one length per
call), which is the same model for those prompts (hf/export_llama.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import torch

from anchormass.cache.kv_policies import POLICIES as KV_POLICIES
from anchormass.errors import ConfigError
from anchormass.eval.items import passkey_setup, ppl_items, score_answer
from anchormass.eval.report import KIB, fmt_p, markdown, mcnemar_exact, plt, save_figure, wilson_interval
from anchormass.eval.scoring import (
    matched_budget,
    progress,
    session_decode,
    shared_session_decode,
    standard_bytes_per_token,
)
from anchormass.eval.suite import EvalContext, Suite
from anchormass.eval.suites.kv_frontier import journal_seed, peer, perplexity
from anchormass.eval.suites.kv_frontier.variants import (
    SELECTIONS,
    Variant,
    build_variant,
    chosen_groups,
    retrieval_scores,
)
from anchormass.models.config import ModelConfig
from anchormass.utils import resolve_path, sha256_file

log = logging.getLogger(__name__)

FULL = "standard/full"
# Past the trained length (original_max_len): "ntk" stretches RoPE's base as every session of this
# project does (docs/method.md §1); "none" keeps plain RoPE, the model `transformers`' Llama runs by default.
ROPE_SCALING = ("ntk", "none")


def without_rope_scaling(model, length: int):
    """`model` with plain RoPE up to `length`: its original_max_len raised so no NTK base applies."""
    model.cfg = model.cfg.replace(original_max_len=max(length, model.cfg.original_max_len))
    return model


def settings_hash(settings: dict, chunk: int, length: int) -> str:
    """What a row of `length` depends on. The prefill chunk counts as min(chunk, length): a prompt no
    longer than the chunk is prefilled whole whatever the chunk, so such rows stay valid when the
    chunk grows (a chunk >= every length prefills each prompt in one forward, as kvpress does)."""
    return hashlib.sha256(json.dumps({**settings, "chunk": min(chunk, length)},
                                     sort_keys=True, default=str).encode()).hexdigest()[:16]


def trial_mean(batch_means: list[tuple[float, int]]) -> float:
    """The mean over trials of per-batch means (mean, trials): batches of unequal size weigh by size."""
    means, sizes = zip(*batch_means)
    return float(np.average(means, weights=sizes))


class KvFrontierSuite(Suite):
    name = "kv_frontier"
    needs_tokenizer = True

    def applies(self, ctx: EvalContext) -> str | None:
        archs = [m.arch for m in ctx.models]
        return None if archs == ["standard"] else f"kv_frontier studies one Standard model's weights; got {archs}"

    # ------------------------------------------------------------------ config
    def check(self, ctx: EvalContext) -> None:
        super().check(ctx)
        why = self.applies(ctx)
        if why:
            raise ConfigError(f"kv_frontier: {why}")
        self.model = ctx.models[0]
        cfg = self.model.config
        self.lengths = [int(x) for x in self.opt("lengths", [1024])]
        self.hay, trials, self.new_tokens = passkey_setup(self.name, dict(self.opt("passkey") or {}), ctx,
                                                          self.lengths)
        self.trials = {L: [t for t in trials if t.length == L] for L in self.lengths}
        self.batch_size = int(self.opt("batch_size", 5))
        self.chunk = int(self.opt("chunk", cfg.prefill_chunk))
        am = dict(self.opt("anchormass") or {})
        shares = [int(s) for s in am.get("shares", [1])]
        selections = [str(s) for s in am.get("selections", list(SELECTIONS))]
        if any(not 1 <= s <= cfg.kv_heads for s in shares) or any(s not in SELECTIONS for s in selections):
            raise ConfigError(f"kv_frontier.anchormass: shares must lie in [1, {cfg.kv_heads}] (KV groups per layer) "
                              f"and selections in {SELECTIONS}; got {shares}, {selections}")
        self.variants = [Variant(share, sel, int(g), bool(o)) for share in shares for sel in selections
                         for g in am.get("group_sizes", [1, 2, 4, 8]) for o in am.get("outliers", [True])]
        self.variants += [Variant(share, sel, int(g), False) for share in shares for sel in selections
                          for g in am.get("no_outlier_group_sizes", [])]
        self.variants += [Variant(share, sel, int(g), True, oracle=True) for share in shares for sel in selections
                          for g in am.get("oracle_group_sizes", [])]
        labels = {v.label for v in self.variants}
        self.baseline_levels = self.opt("baseline_levels")  # None: every distinct AnchorMass byte level
        if self.baseline_levels is not None and not set(self.baseline_levels) <= labels:
            raise ConfigError(f"kv_frontier.baseline_levels: {sorted(set(self.baseline_levels) - labels)} are not "
                              f"AnchorMass cells of this run ({sorted(labels)})")
        self.kv_policies = {}
        for name in self.opt("kv_policies", list(KV_POLICIES)):
            if name not in KV_POLICIES:
                raise ConfigError(f"kv_frontier.kv_policies: unknown {name!r}; choose from {sorted(KV_POLICIES)}")
            self.kv_policies[name] = KV_POLICIES[name](**dict((self.opt("policy_args") or {}).get(name) or {}))
        probe = dict(self.opt("probe") or {})
        self.probe_hay, self.probe_trials, _ = passkey_setup(
            f"{self.name}.probe", {**dict(self.opt("passkey") or {}), **probe}, ctx, [int(probe.get("length", 1024))])
        self.rope_scaling = str(self.opt("rope_scaling", "ntk"))
        if self.rope_scaling not in ROPE_SCALING:
            raise ConfigError(f"kv_frontier.rope_scaling: {self.rope_scaling!r}; choose from {ROPE_SCALING}")
        kvp = dict(self.opt("kvpress") or {})
        self.kvpress_python = peer.check_python(kvp["python"]) if kvp.get("python") else None
        self.presses = list(kvp.get("presses", []))
        self.pairs = dict(kvp.get("pairs", {}))  # press class -> our policy it implements
        self.only_finished = bool(self.opt("only_finished", False))
        for path in self.opt("journal_from") or []:  # before any model runs, not after the probe
            if not resolve_path(str(path)).is_file():
                raise ConfigError(f"kv_frontier.journal_from: no report at {path}")
        self.work = resolve_path(self.opt("work_dir") or f"runs/kv_frontier/{(self.model.sha256 or 'random')[:12]}")
        self.work.mkdir(parents=True, exist_ok=True)
        self.trained = self._check_trained(dict(self.opt("trained") or {}))
        self._check_ppl(ctx, labels | set(self.trained))
        self.batch_tokens = int(self.opt("batch_tokens", 8192))
        self.probe_length = int(probe.get("length", 1024))
        self.weights = journal_seed.weights_key(self.model.model)  # the same weights under another file
        self._settings = {"model": self.weights, "passkey": self.opt("passkey"), "new_tokens": self.new_tokens,
                          "policy_args": self.opt("policy_args"), "probe": probe, "rope_scaling": self.rope_scaling}

    def _check_trained(self, trained: dict) -> dict[str, dict]:
        """{`trained/<label>`: {path, sha256}} for each AnchorMass checkpoint to score beside the
        training-free methods; each must hold this Standard's tensor shapes (it was trained from them).
        A row is journaled under the checkpoint's sha256, so a retrained cell is scored again."""
        from anchormass.training.checkpoint import read_checkpoint
        from anchormass.training.objectives import check_same_shapes

        out = {}
        for label, path in trained.items():
            path = resolve_path(str(path))
            if not path.is_file():
                raise ConfigError(f"kv_frontier.trained.{label}: no checkpoint at {path}")
            ckpt = read_checkpoint(path)
            saved = ModelConfig.from_dict(ckpt["hyper_parameters"]["model_config"])
            if saved.arch != "anchormass":
                raise ConfigError(f"kv_frontier.trained.{label}: {path} is a {saved.arch} model, not AnchorMass")
            check_same_shapes(saved.to_dict(), self.model.config.to_dict(), f"kv_frontier.trained.{label} ({path})")
            # a checkpoint of a stage still training scores as well as a finished one, so the report
            # says which step it holds (a journal row is keyed by the file's checksum, not its step)
            step, total = int(ckpt.get("global_step", 0)), ckpt["hyper_parameters"].get("total_steps")
            total = None if total is None else int(total)
            if total is not None and step < total:
                log.warning("kv_frontier.trained.%s: %s holds step %d of its stage's %d (mid-run)",
                            label, path, step, total)
            out[f"trained/{label}"] = {"path": path, "sha256": sha256_file(path), "group_size": saved.group_size,
                                       "step": step, "total_steps": total}
        return out

    def _check_ppl(self, ctx: EvalContext, labels: set[str]) -> None:
        """The perplexity part (optional): its anchors and the cells it scores, checked up front."""
        cfg = dict(self.opt("ppl") or {})
        self.ppl = None
        if not cfg:
            return
        cells = [str(c) for c in cfg.pop("cells", [])]
        if not set(cells) <= labels:
            raise ConfigError(f"kv_frontier.ppl.cells: {sorted(set(cells) - labels)} are not AnchorMass cells of "
                              f"this run ({sorted(labels)})")
        items = ppl_items(cfg, ctx)
        for cell in cells:
            variant = next((v for v in self.variants if v.label == cell), None)
            group_size = variant.group_size if variant else self.trained[cell]["group_size"]
            perplexity.check_budget(cell, group_size, self.model.config.slot_budget,
                                    max(items.contexts) + items.target_len)
        path = Path(items.tokens.filename)  # ppl_items memory-maps the token file
        shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
        self.ppl = {"items": items, "cells": cells, "data": str(shown), "key": perplexity.anchors_key(
            items.anchors, items.target_len, sha256_file(path))}

    def _longest(self) -> int:
        """The longest sequence any session of this run holds: prompt plus answer, or a perplexity window."""
        ppl = 0 if self.ppl is None else max(self.ppl["items"].contexts) + self.ppl["items"].target_len
        return max(max(self.lengths) + self.new_tokens, ppl)

    def settings_key(self, length: int) -> str:
        return self._settings_key(self._settings, self.chunk, length)

    def _settings_key(self, settings: dict, chunk: int, length: int) -> str:
        """The RoPE scaling counts only for a row past the trained length, where it changes the model."""
        chosen = settings.get("rope_scaling", "ntk")
        # below the trained length every scaling is the same model, the default's
        applies = chosen if chosen != "ntk" and length > self.model.config.original_max_len else "ntk"
        rest = {k: v for k, v in settings.items() if k != "rope_scaling"}
        return settings_hash({**rest, **journal_seed.rope_setting(applies)}, chunk, length)

    def _key_length(self, key: str) -> int:
        """The prompt length a journal row was measured at: probe, ppl/<anchors>/<length>/..., <length>/..."""
        if key == "probe":
            return self.probe_length
        parts = key.split("/")
        return int(parts[2] if parts[0] == "ppl" else parts[0])

    # ------------------------------------------------------------------ journal of finished rows
    def _journal(self) -> dict[str, dict]:
        path = self.work / "rows.jsonl"
        rows = {}
        if path.is_file():
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line cut by a kill: that row is simply run again
                key = entry.get("key", "")
                try:
                    length = self._key_length(key)
                except (ValueError, IndexError):
                    continue  # not a row of this suite's
                if entry.get("settings") == self.settings_key(length):
                    rows[key] = entry["row"]
        return rows

    def _seed(self, done: dict, path: Path, scores: torch.Tensor) -> None:
        """Add to the journal the rows of an earlier report that were measured under these settings
        (a fresh clone continues from the committed results instead of measuring them again)."""
        now = None if self.ppl is None else {"key": self.ppl["key"], "data": self.ppl["data"],
                                             "anchors": self.ppl["items"].anchors,
                                             "target_len": self.ppl["items"].target_len}
        settings, chunk, found = journal_seed.report_rows(path, now, self.weights, scores)
        taken = 0
        for key, row in found:
            length = self._key_length(key)
            if self._settings_key(settings, chunk, length) == self.settings_key(length) and key not in done:
                done[key] = row
                self._append(key, row)
                taken += 1
        rows = [key for key, _ in found if key != "probe"]  # the probe was measured here before seeding
        if rows and not taken and not any(key in done for key in rows):
            raise ConfigError(f"kv_frontier.journal_from: {path} was measured under other settings (model, "
                              f"passkey, new_tokens, policy_args, probe, chunk or, past the trained length, "
                              f"rope_scaling); none of its rows apply here")

    def _append(self, key: str, row: dict) -> None:
        with open(self.work / "rows.jsonl", "a") as f:
            f.write(json.dumps({"settings": self.settings_key(self._key_length(key)), "key": key, "row": row}) + "\n")
            f.flush()

    def _parts(self, key: str, length: int) -> dict[tuple[int, int], list[dict]]:
        """The finished batches of row `key` under these settings: (first trial, trials) -> per method."""
        path, found = self.work / "partial.jsonl", {}
        if path.is_file():
            settings = self.settings_key(length)
            for line in path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line cut by a kill: that batch is simply run again
                if entry.get("key") == key and entry.get("settings") == settings:
                    found[(entry["start"], entry["trials"])] = entry["methods"]
        return found

    def _append_part(self, key: str, length: int, start: int, trials: int, methods: list[dict]) -> None:
        with open(self.work / "partial.jsonl", "a") as f:
            f.write(json.dumps({"settings": self.settings_key(length), "key": key, "start": start,
                                "trials": trials, "methods": methods}) + "\n")
            f.flush()

    # ------------------------------------------------------------------ running
    def _key_digits(self, trial, ids: list[int]) -> list[bool]:
        """Per prompt position: is it a token of the needle that spells a digit (the oracle's marks)."""
        lo, hi = self.hay.needle_span(trial)
        tok = self.hay.tok
        return [lo <= p < hi and any(ch.isdigit() for ch in tok.decode([i])) for p, i in enumerate(ids)]

    def _ours(self, model, length: int, key: str, policy=None, budget=None, oracle: bool = False) -> dict:
        """Greedy answers of every trial of `length` through `model`'s cache: outcomes and bytes
        (`key`: the journal row they make; its finished batches are kept as they finish)."""
        def decode(ids, batch, prompts):
            forced = (torch.tensor([self._key_digits(t, p) for t, p in zip(batch, prompts)], device=ids.device)
                      if oracle else None)
            return [session_decode(model, ids, self.new_tokens, self.chunk, policy, budget,
                                   vocab_limit=self.hay.tok.vocab_size, forced=forced)]

        return self._answer_trials(model, length, decode, key)[0]

    def _standard_methods(self, length: int, settings: list[tuple], key: str) -> list[dict]:
        """`_ours` of the Standard for each (policy, budget) of `settings` (None: the full cache). A prompt
        prefilled in one forward is shared by them all (cache/shared_prefill.py: the same answers and
        bytes as one session each), so the methods at equal bytes cost one long forward per trial."""
        std, vocab = self.model.model, self.hay.tok.vocab_size

        def decode(ids, batch, prompts):
            if self.chunk >= length:
                return shared_session_decode(std, ids, self.new_tokens, self.chunk, settings, vocab_limit=vocab)
            return [session_decode(std, ids, self.new_tokens, self.chunk, policy, budget, vocab_limit=vocab)
                    for policy, budget in settings]

        return self._answer_trials(std, length, decode, key)

    def _answer_trials(self, model, length: int, decode, key: str) -> list[dict]:
        """Every trial of `length` in batches; decode(ids, trials, prompts) -> [(answers, KVBytes)] per
        method. Per method: outcomes, mean stored bytes per sequence, measured tokens per slot.

        Each finished batch is journaled as a part of row `key` (partial.jsonl), and a rerun takes the
        parts back instead of measuring them again: a 16K row is hours on one core, and a kill
        would otherwise lose every trial it had finished."""
        tok, trials = self.hay.tok, self.trials[length]
        device = next(model.parameters()).device
        per_batch = max(1, min(self.batch_size, self.batch_tokens // length))  # bounds a whole-prompt prefill
        kept = self._parts(key, length)
        found: list[dict] = []
        for s in range(0, len(trials), per_batch):
            batch = trials[s:s + per_batch]
            part = kept.get((s, len(batch)))
            if part is None:
                prompts = [self.hay.build(t) for t in batch]
                ids = torch.tensor(prompts, dtype=torch.long, device=device)
                part = [{"outcomes": [{"ids": row, **score_answer(tok.decode(row), t.key)}
                                      for t, row in zip(batch, new.tolist())],
                         "stored": kv.stored_end / len(batch), "ratio": kv.tokens_per_slot}
                        for new, kv in decode(ids, batch, prompts)]
                self._append_part(key, length, s, len(batch), part)
            for i, method in enumerate(part):
                if i == len(found):
                    found.append({"outcomes": [], "stored": [], "ratios": []})
                found[i]["outcomes"] += method["outcomes"]
                # a batch's figures are its means: weighted by its trials, they give the per-trial mean
                found[i]["stored"].append((method["stored"], len(batch)))
                if method["ratio"] is not None:
                    found[i]["ratios"].append((method["ratio"], len(batch)))
        return [{"outcomes": f["outcomes"], "stored": trial_mean(f["stored"]),
                 "tokens_per_slot": trial_mean(f["ratios"]) if f["ratios"] else None} for f in found]

    def _row(self, length: int, method: str, level: str, res: dict, **extra) -> dict:
        exact = [bool(o["exact"]) for o in res["outcomes"]]
        return {"length": length, "method": method, "level": level, "stored": res["stored"],
                "tokens_per_slot": res.get("tokens_per_slot"), "k": sum(exact), "n": len(exact),
                "exact": exact, "digits": [int(o["digits"]) for o in res["outcomes"]],
                "answers": [o["ids"] for o in res["outcomes"]], **extra}

    def run(self, ctx: EvalContext) -> dict:
        std, cfg = self.model.model, self.model.model.cfg
        if self.rope_scaling == "none":  # variants are built from std's config and inherit it
            without_rope_scaling(std, self._longest())
        try:
            return self._run(ctx, std)
        finally:
            std.cfg = cfg  # the next suite sees the model as loaded

    def _run(self, ctx: EvalContext, std) -> dict:
        per_token = standard_bytes_per_token(std)
        done = self._journal()
        fed = max(0, self.new_tokens - 1)  # tokens fed after the prefill (the last answer token is not)

        missing: list[str] = []

        def once(key: str, make) -> dict | None:
            if key not in done:
                if self.only_finished:  # report what the journal holds; name the rest
                    missing.append(key)
                    return None
                done[key] = make()
                self._append(key, done[key])
            return done[key]

        def measure_probe():
            return {"scores": retrieval_scores(std, [self.probe_hay.build(t) for t in self.probe_trials],
                                               [self.probe_hay.needle_span(t) for t in self.probe_trials]).tolist()}

        if self.opt("journal_from") and "probe" not in done:  # seeding compares it, only_finished or not
            done["probe"] = measure_probe()
            self._append("probe", done["probe"])
        probe = once("probe", measure_probe)
        if probe is None:
            raise ConfigError(f"kv_frontier: only_finished=true, but {self.work / 'rows.jsonl'} holds no finished "
                              f"rows of these settings")
        scores = torch.tensor(probe["scores"])
        for path in self.opt("journal_from") or []:
            self._seed(done, resolve_path(str(path)), scores)
        rows: list[dict] = []
        # every AnchorMass cell made from these weights, then every trained one, at each length
        def variant_row(L: int, cell) -> tuple[str, object]:
            groups = chosen_groups(scores, cell.share, cell.selection)
            key = journal_seed.row_key(L, cell.label, cell.label)
            return key, lambda: self._row(L, cell.label, cell.label, self._ours(
                build_variant(std, cell, groups), L, key, oracle=cell.oracle), groups=groups)

        def trained_row(L: int, label: str) -> tuple[str, object]:
            own = self.trained[label]["sha256"][:12]
            key = journal_seed.row_key(L, label, label, own)
            return key, lambda: self._row(L, label, label, self._ours(self._load_trained(label), L, key),
                                          checkpoint=own)

        cells = [(variant_row, L, v) for L in self.lengths for v in self.variants]
        cells += [(trained_row, L, label) for L in self.lengths for label in self.trained]
        for make, L, cell in progress(cells, ctx.progress, "kv frontier"):
            rows.append(once(*make(L, cell)))
        rows = [r for r in rows if r is not None]  # only_finished: the cells not run yet are named, not shown
        # Baselines at every distinct AnchorMass byte level (the first variant of each stands for it).
        levels: dict[tuple, dict] = {}
        for r in rows:
            v = next((v for v in self.variants if v.label == r["method"]), None)
            if v is None:
                continue
            # by default every distinct level but the oracle's (a diagnostic, not a budget to match)
            if (not v.oracle) if self.baseline_levels is None else v.label in self.baseline_levels:
                levels.setdefault((r["length"], v.bytes_key), r)
        press_specs, press_rows = [], []
        for L in progress(self.lengths, ctx.progress, "kv frontier full cache and baselines"):
            # (journal key, method, level, policy, budget, note): the Standard's own methods at this length
            jobs = [(journal_seed.row_key(L, FULL, "full"), FULL, "full", None, None, None)]
            for ref in (ref for (at, _), ref in levels.items() if at == L):
                target = ref["stored"] / per_token  # tokens per KV head that cost the same bytes
                for name, policy in self.kv_policies.items():
                    budget, note = matched_budget(policy, target, fed)
                    method = f"ours/{name}"
                    jobs.append((journal_seed.row_key(L, method, ref["level"]), method, ref["level"], policy, budget,
                                 note))
                kept = max(1, round(target) - fed)  # kvpress keeps int(L * (1 - ratio)) prompt tokens
                for press in self.presses:
                    label = journal_seed.row_key(L, f"kvpress/{press['press']}", ref["level"])
                    if label in done:
                        rows.append(done[label])
                    elif self.only_finished:
                        missing.append(label)
                    else:
                        press_specs.append({"label": label, "press": press["press"], "kwargs": {
                            **press.get("kwargs", {}), "compression_ratio": (L - kept - 0.5) / L}})
                        press_rows.append((label, L, ref["level"], kept))
            todo = [job for job in jobs if job[0] not in done]
            if self.only_finished:
                missing += [job[0] for job in todo]
            elif todo:
                for (key, method, level, _, budget, note), res in zip(
                        todo, self._standard_methods(L, [(policy, budget) for _, _, _, policy, budget, _ in todo],
                                                     " + ".join(job[0] for job in todo))):
                    extra = {} if method == FULL else {"budget": budget, "note": note}
                    done[key] = self._row(L, method, level, res, **extra)
                    self._append(key, done[key])
            rows += [done[job[0]] for job in jobs if job[0] in done]
        if press_specs and self.kvpress_python is not None:
            rows += self._kvpress(ctx, press_specs, press_rows, per_token, done)
        rows = [r for r in rows if r is not None]
        ppl = self._perplexity(ctx, std, scores, once)
        summary = {f"L{r['length']}/{r['level']}/{r['method']}": r["k"] / r["n"] for r in rows if r["n"]}
        return {"settings": {"lengths": self.lengths, "new_tokens": self.new_tokens, "passkey_trials":
                             len(self.trials[self.lengths[0]]), "standard_bytes_per_token": per_token,
                             "model": self.model.label, "sha256": self.model.sha256, "weights": self.weights,
                             "rope_scaling": self.rope_scaling,
                             "pairs": self.pairs,
                             "retrieval_scores": scores.tolist(), "chunk": self.chunk,
                             "kvpress": None if self.kvpress_python is None else "kvpress 0.5.5",
                             "trained": {m: {"sha256": t["sha256"][:12], "step": t["step"],
                                             "total_steps": t["total_steps"]} for m, t in self.trained.items()},
                             "not_run_yet": missing},
                "rows": rows, "summary": summary, **({"ppl": ppl} if ppl else {})}

    def _load_trained(self, label: str):
        """The trained cell's model, read (and its checksum verified) once for every length and the perplexity."""
        info = self.trained[label]
        if "model" not in info:
            from anchormass.training.checkpoint import load_model

            model, _ = load_model(info["path"])
            if self.rope_scaling == "none":
                without_rope_scaling(model, self._longest())
            info["model"] = model.to(next(self.model.model.parameters()).device)
        return info["model"]

    def _perplexity(self, ctx, std, scores, once) -> dict | None:
        """NLL per anchor for the full cache and each chosen cell at every prior context (journaled)."""
        if self.ppl is None:
            return None
        items, nll = self.ppl["items"], {}
        steps = [(m, c) for m in [FULL, *self.ppl["cells"]] for c in items.contexts]
        models = {FULL: std}
        for method, c in progress(steps, ctx.progress, "kv frontier ppl"):
            def score():
                if method in self.trained:
                    models[method] = self._load_trained(method)
                if method not in models:
                    variant = next(v for v in self.variants if v.label == method)
                    models[method] = build_variant(std, variant, chosen_groups(scores, variant.share,
                                                                               variant.selection))
                return {"nll": perplexity.mean_nll(models[method], items.tokens, items.anchors, c, items.target_len)}

            own = self.trained[method]["sha256"][:12] if method in self.trained else None
            row = once(journal_seed.ppl_key(self.ppl["key"], c + items.target_len, method, own), score)
            if row is not None:
                nll.setdefault(method, {})[str(c)] = row["nll"]
        if FULL not in nll:
            return None
        return {"contexts": items.contexts, "target_len": items.target_len, "anchors": items.anchors,
                "data": self.ppl["data"], "key": self.ppl["key"], "nll": nll,
                "trained_sha256": {m: self.trained[m]["sha256"][:12] for m in nll if m in self.trained}}

    def _kvpress(self, ctx, specs, wanted, per_token, done) -> list[dict]:
        """Each press spec answers only its own length's trials (one runner call per length)."""
        tok, rows = self.hay.tok, []
        for L in sorted({L for _, L, _, _ in wanted}):
            items = [{"id": f"{L}/{i}", "prompt_ids": self.hay.build(t)} for i, t in enumerate(self.trials[L])]
            # Past the trained length under NTK our sessions fix RoPE's base from the prompt's length, so
            # kvpress gets the Llama with that base: the same model for these prompts (hf/export_llama.py).
            sizes = {len(item["prompt_ids"]) for item in items}
            if len(sizes) != 1:
                raise ConfigError(f"kv_frontier: the {L}-token prompts differ in length ({sorted(sizes)}); "
                                  f"kvpress's model is exported for one prompt length")
            folder = peer.export_folder(self.model.model, ctx.tokenizer.special_ids(), self.work, sizes.pop())
            at = [w for w in wanted if w[1] == L]
            labels = {label for label, *_ in at}
            answers = peer.answer(self.kvpress_python, folder, [s for s in specs if s["label"] in labels], items,
                                  self.new_tokens, self.work,  # answers of another model get another file
                                  tag=f"L{L}" if folder.name == "llama" else f"L{L}_{folder.name}",
                                  threads=torch.get_num_threads())  # this run's torch_threads, not one
            for label, _, level, kept in at:
                got = [answers[label][item["id"]] for item in items]
                outcomes = [{"ids": a["ids"], **score_answer(tok.decode(a["ids"]), t.key)}
                            for a, t in zip(got, self.trials[L])]
                stored = float(np.mean([a["stored_bytes"] for a in got])) + (self.new_tokens - 1) * per_token
                res = {"outcomes": outcomes, "stored": stored}
                row = self._row(L, f"kvpress/{label.rsplit('/', 1)[1]}", level, res,
                                kept=int(np.mean([np.mean(a["kept"]) for a in got])), budget=kept)
                done[label] = row
                self._append(label, row)
                rows.append(row)
        return rows

    # ------------------------------------------------------------------ results
    def report(self, result: dict) -> str:
        return report_markdown(result)

    def plots(self, result: dict, out_dir: Path) -> list[str]:
        if not result["rows"]:  # only_finished before any row finished: the report names them all
            return []
        return [frontier_plot(result["rows"], Path(out_dir) / "kv_frontier.png")]


def _stats(rows: list[dict]) -> list[dict]:
    """Each row with its Wilson interval and exact McNemar against the full cache at its length."""
    full = {r["length"]: r for r in rows if r["method"] == FULL}
    out = []
    for r in rows:
        lo, hi = wilson_interval(r["k"], r["n"])
        ref = full.get(r["length"])
        test = mcnemar_exact(ref["exact"], r["exact"]) if ref is not None and r is not ref else None
        out.append({**r, "ci": [lo, hi], "mcnemar_vs_full": test})
    return out


def agreement(rows: list[dict], pairs: dict[str, str]) -> list[list]:
    """Per length and level, for each press that implements one of our policies: items with the same
    answer ids, and with the same exact outcome, out of n."""
    table = []
    index = {(r["length"], r["level"], r["method"]): r for r in rows}
    for (L, level, method), r in sorted(index.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        if not method.startswith("kvpress/") or method.split("/")[1] not in pairs:
            continue
        ours = index.get((L, level, f"ours/{pairs[method.split('/')[1]]}"))
        if ours is None:
            continue
        same_ids = sum(a == b for a, b in zip(r["answers"], ours["answers"]))
        same_exact = sum(a == b for a, b in zip(r["exact"], ours["exact"]))
        table.append([f"{L:,}", level, f"{method} vs {ours['method']}", f"{same_ids}/{r['n']}",
                      f"{same_exact}/{r['n']}", f"{r.get('kept', '-')} vs {ours.get('budget', '-')}"])
    return table


def by_length(rows: list[dict], lengths: list[int]) -> str:
    """One line per method and level, one column per length: exact [Wilson 95%], stored KiB and, for
    an AnchorMass cell, its measured tokens per global slot (its real ratio, not its group size)."""
    cells: dict[tuple, dict] = {}
    for r in rows:
        ratio = "" if r.get("tokens_per_slot") is None else f", {r['tokens_per_slot']:.2f}:1"
        cells.setdefault((r["level"] != "full", r["level"], r["method"]), {})[r["length"]] = (
            f"{r['k']}/{r['n']} [{100 * r['ci'][0]:.0f}, {100 * r['ci'][1]:.0f}] · {r['stored'] / KIB:,.0f} KiB{ratio}")
    body = [[level, method, *(got.get(L, "-") for L in lengths)]
            for (_, level, method), got in sorted(cells.items())]
    return "### Method by length\n\n" + markdown(
        ["level", "method", *(f"{L:,} tokens: exact [95% CI] · stored" for L in lengths)], body)


def report_markdown(result: dict) -> str:
    s = result["settings"]
    rows = _stats(result["rows"])
    text = ["## Recall against stored KV bytes on one model's weights (training-free)\n"]
    for L in s["lengths"]:
        at = sorted((r for r in rows if r["length"] == L), key=lambda r: (r["level"] != "full", r["level"],
                                                                         r["method"]))
        body = []
        for r in at:
            ratio = "-" if r.get("tokens_per_slot") is None else f"{r['tokens_per_slot']:.2f}"
            test = r["mcnemar_vs_full"]
            body.append([r["level"], r["method"], f"{r['stored'] / KIB:,.1f}", ratio,
                         f"{r['k']}/{r['n']} [{100 * r['ci'][0]:.0f}%, {100 * r['ci'][1]:.0f}%]",
                         f"{np.mean(r['digits']):.2f}", "-" if test is None else fmt_p(test["p"]),
                         r.get("budget", "-") if r.get("budget") is not None else "-"])
        text.append(f"### {L:,} tokens\n\n" + markdown(
            ["level", "method", "stored KiB / seq", "tokens per global slot", "passkey exact [95% CI]",
             "digits (of 4)", "McNemar p vs full", "prompt tokens kept / KV head"], body))
    if len(s["lengths"]) > 1:
        text.append(by_length(rows, s["lengths"]))
    if s.get("trained"):
        text.append(trained_line(s["trained"]))
    if s.get("not_run_yet"):
        text.append(f"Not run yet (the journal holds no row for them; a rerun without only_finished runs them): "
                    f"{', '.join(s['not_run_yet'])}.\n")
    if result.get("ppl"):
        text.append(perplexity.report(result["ppl"]))
    pairs = agreement(rows, s.get("pairs") or {})
    if pairs:
        text.append("### Agreement with kvpress, item by item\n\n" + markdown(
            ["length", "level", "press vs ours", "same answer ids", "same exact outcome",
             "tokens kept (press vs ours)"], pairs))
    text.append(f"{s['passkey_trials']} passkey trials per length (5 depths x 3 keys, needles jittered inside the "
                f"64-token block), greedy, {s['new_tokens']} new tokens; stored = keys, values (and AnchorMass's "
                f"slot masses) kept after the last token, per sequence; a Standard token costs "
                f"{s['standard_bytes_per_token']:,} B. A level is an AnchorMass cell (am/<selection><global groups "
                f"per layer>/g<group size>); the other methods keep the bytes that cell stored. Tokens per global "
                f"slot is the cell's measured merge ratio. CI: Wilson 95%; McNemar: exact, two-sided, against the "
                f"full cache on the same trials. RoPE past the model's trained length: "
                f"{'plain (no scaling)' if s.get('rope_scaling') == 'none' else 'dynamic NTK'}.\n")
    return "\n".join(text)


def trained_line(trained: dict) -> str:
    """Which checkpoint each trained cell is, and whether its stage had finished when it was saved."""
    def one(label: str, t: dict) -> str:
        total = t.get("total_steps")
        mid = total is not None and t["step"] < total
        of = f"step {t['step']:,}" + ("" if total is None else f" of {total:,}") + (" (mid-run)" if mid else "")
        return f"{label} {of}, sha256 {t['sha256']}"
    return "Trained cells' checkpoints: " + "; ".join(one(m, t) for m, t in trained.items()) + ".\n"


def frontier_plot(rows: list[dict], path: Path) -> str:
    """Passkey exact (y) against stored KiB (x, log), one panel per length; AnchorMass cells as
    circles labelled by their tokens per slot, baselines as lines across levels, the full cache a star."""
    lengths = sorted({r["length"] for r in rows})
    width = max(9.0, 4.6 * len(lengths) + 3)
    right = 1 - 2.8 / width  # the panels' share of the figure; the legend takes the last 2.8 inches
    fig, axes = plt.subplots(1, len(lengths), figsize=(width, 4.2), squeeze=False)
    families = sorted({r["method"] for r in rows
                       if not r["method"].startswith(("am/", "trained/")) and r["method"] != FULL})
    colour = {m: f"C{i % 10}" for i, m in enumerate(families)}
    for ax, L in zip(axes[0], lengths):
        at = [r for r in rows if r["length"] == L]
        for m in families:
            pts = sorted((r["stored"] / KIB, r["k"] / r["n"]) for r in at if r["method"] == m)
            if pts:
                ax.plot(*zip(*pts), marker="s", ms=4, ls="--", color=colour[m], label=m)
        for r in at:
            if r["method"].startswith("am/"):
                x, y = r["stored"] / KIB, r["k"] / r["n"]
                ax.plot(x, y, marker="o", ms=6, ls="none", color="k" if "retrieval" in r["method"] else "grey")
                if r.get("tokens_per_slot"):
                    ax.annotate(f"{r['tokens_per_slot']:.1f}:1", (x, y), fontsize=6, xytext=(3, 3),
                                textcoords="offset points")
            elif r["method"].startswith("trained/"):  # a retrofit cell: its own point, named
                ax.plot(r["stored"] / KIB, r["k"] / r["n"], marker="D", ms=6, ls="none", color="C6")
                ax.annotate(r["method"].removeprefix("trained/"), (r["stored"] / KIB, r["k"] / r["n"]), fontsize=6,
                            xytext=(3, -8), textcoords="offset points")
            elif r["method"] == FULL:
                ax.plot(r["stored"] / KIB, r["k"] / r["n"], marker="*", ms=12, ls="none", color="C3", label=FULL)
        ax.set_xscale("log")
        ax.set_ylim(-0.05, 1.05)
        ax.grid(alpha=0.3)
        ax.set_title(f"{L:,} tokens (black: retrieval-chosen, grey: by index)", fontsize=8)
        ax.set_xlabel("stored KV per sequence (KiB, log)")
    axes[0][0].set_ylabel("passkey exact match")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(right + 0.005, 0.5), fontsize=7)
    return save_figure(fig, path, rect=(0, 0, right, 1))  # the legend beside the panels, not over a point
