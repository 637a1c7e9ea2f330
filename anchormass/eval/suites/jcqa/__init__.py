"""(e) JCommonsenseQA (docs/method.md §6 e): summed log-likelihood per choice, acc and acc_norm.

Each (prompt, continuation) pair is tokenised as lm-evaluation-harness does: whitespace ending
the prompt moves to the continuation, prompt + continuation is tokenised as one text, and the
continuation is the tokens past the prompt's own token count. So a continuation's tokens are
those it has inside the full text (SentencePiece adds no word-start "▁" of its own before a
choice that follows the prompt directly). Its score is the summed log-probability of those
tokens. acc picks the highest sum; acc_norm the highest sum / character length of the choice.
Two models: exact McNemar on the per-question correctness vectors.
"""

from __future__ import annotations

import numpy as np
import torch

from anchormass.eval.report import fmt_p, markdown, mcnemar_exact, pct
from anchormass.eval.scoring import gather_logprobs, padded_logits, progress
from anchormass.eval.suite import EvalContext, Suite
from anchormass.eval.suites.jcqa.questions import (
    build_prompt,
    continuations,
    load_split,
    resolve_template,
    shots_per_question,
)


def choice_logliks(model, seqs: list[tuple[list[int], list[int]]], pad_id: int, device) -> list[float]:
    """Summed log p(continuation | context) for each (context ids, continuation ids) pair.

    The model reads context + continuation minus its last token (which predicts nothing scored),
    as lm-evaluation-harness feeds a request; that input's length sets the dynamic-NTK base past
    the trained length (docs/method.md §1). One right-padded batch through the parallel forward,
    told each input's length: attention is causal and each input gets the RoPE base it would get
    alone, so a score does not depend on which other sequences share the batch or how long they
    are. Only continuation positions go through the LM head."""
    inputs = [c + x[:-1] if x else c for c, x in seqs]
    lengths = [len(s) for s in inputs]
    ids = torch.full((len(seqs), max(lengths)), pad_id, dtype=torch.long, device=device)
    rows, cols, tgts = [], [], []
    for i, (c, x) in enumerate(seqs):
        ids[i, :lengths[i]] = torch.tensor(inputs[i], dtype=torch.long)
        for j in range(len(x)):  # position len(c)-1+j predicts x[j]
            rows.append(i)
            cols.append(len(c) - 1 + j)
            tgts.append(x[j])
    rows_t, cols_t = torch.tensor(rows, device=device), torch.tensor(cols, device=device)
    logits = padded_logits(model, ids, lengths, rows_t, cols_t)  # [n, V]
    lp = gather_logprobs(logits, torch.tensor(tgts, device=device))  # [n]
    return torch.zeros(len(seqs), device=device, dtype=lp.dtype).index_add_(0, rows_t, lp).tolist()


def encode_pair(tokenizer, context: str, continuation: str, head: list[int]) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids): the continuation is split off the joint tokenisation at
    the context's token count; `head` (e.g. bos) precedes the context."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    ctx_ids = tokenizer.encode(context)
    whole = tokenizer.encode(context + continuation)
    return head + ctx_ids, whole[len(ctx_ids):]


def score_questions(model, tokenizer, questions: list[dict], shots: list[list[dict]], template: dict, *,
                    device, batch_questions: int = 4, bos: bool = False, show: bool = False,
                    desc: str = "jcqa") -> list[dict]:
    """Per question (shots[i]: the solved examples before questions[i]): choice log-likelihoods,
    predictions (acc / acc_norm) and correctness."""
    out = []
    head = [tokenizer.bos_id] if bos else []
    order = list(range(len(questions)))
    batches = [order[i:i + batch_questions] for i in range(0, len(order), batch_questions)]
    for batch in progress(batches, show, desc):
        seqs = []
        for i in batch:
            prompt = build_prompt(template, shots[i], questions[i])
            seqs += [encode_pair(tokenizer, prompt, cont, head) for cont in continuations(template, questions[i])]
        lls = choice_logliks(model, seqs, tokenizer.pad_id, device)
        k = 0
        for i in batch:
            q = questions[i]
            ll = lls[k:k + len(q["choices"])]
            k += len(q["choices"])
            norm = [v / max(1, len(ch)) for v, ch in zip(ll, q["choices"])]
            pred, pred_n = int(np.argmax(ll)), int(np.argmax(norm))
            out.append({"q_id": q["q_id"], "label": q["label"], "loglik": ll, "pred": pred, "pred_norm": pred_n,
                        "correct": pred == q["label"], "correct_norm": pred_n == q["label"]})
    return out


class JcqaSuite(Suite):
    name = "jcqa"
    in_all = True
    needs_tokenizer = True

    def applies(self, ctx: EvalContext) -> str | None:
        if not any(self.opt(k) for k in ("dir", "valid", "hub")):
            return ("no JCommonsenseQA data: pass eval.jcqa.dir=<JGLUE folder>, eval.jcqa.valid=<jsonl> "
                    "or eval.jcqa.hub=<name>")
        return None

    def check(self, ctx: EvalContext) -> None:
        super().check(ctx)
        self.template = resolve_template(self.opt("template") or "simple")
        self.questions, src = load_split(self.cfg, "validation")
        ctx.record_data("jcqa_valid", src)
        if self.opt("limit"):
            self.questions = self.questions[: int(self.opt("limit"))]
        n_shots = int(self.opt("n_shots", 3))
        train = []
        if n_shots:
            train, tsrc = load_split(self.cfg, "train")
            ctx.record_data("jcqa_train", tsrc)
        self.shots = shots_per_question(train, len(self.questions), n_shots, int(self.opt("shot_seed", 1234)),
                                        self.template["shot_sampling"])
        longest = max(len(ctx.tokenizer.encode(build_prompt(self.template, shots, q))) + 64
                      for q, shots in zip(self.questions[:50], self.shots))
        ctx.check_length("jcqa", longest)

    def run(self, ctx: EvalContext) -> dict:
        per_model = {}
        for m in ctx.models:
            per_model[m.label] = score_questions(
                m.model, ctx.tokenizer, self.questions, self.shots, self.template, device=ctx.device,
                batch_questions=int(self.opt("batch_questions", 4)), bos=bool(self.opt("bos", False)),
                show=ctx.progress, desc=f"jcqa [{m.label}]")
        labels = list(per_model)
        summary, rows = {}, {}
        for lab, res in per_model.items():
            n = len(res)
            rows[lab] = {"n": n, "correct": sum(r["correct"] for r in res),
                         "correct_norm": sum(r["correct_norm"] for r in res)}
            summary[f"{lab}/acc"] = rows[lab]["correct"] / n
            summary[f"{lab}/acc_norm"] = rows[lab]["correct_norm"] / n
        shot_ids = [[s["q_id"] for s in shots] for shots in self.shots]
        out = {"labels": labels, "n_questions": len(self.questions), "n_shots": len(self.shots[0]),
               "shot_sampling": self.template["shot_sampling"],
               "shot_ids": shot_ids[0] if self.template["shot_sampling"] == "fixed" else shot_ids,
               "template": self.template, "rows": rows,
               "correct": {lab: [r["correct"] for r in res] for lab, res in per_model.items()},
               "items": [{"model": lab, **r} for lab, res in per_model.items() for r in res], "summary": summary}
        if ctx.paired:
            a, b = labels
            out["mcnemar"] = mcnemar_exact(out["correct"][a], out["correct"][b])
            out["mcnemar_norm"] = mcnemar_exact([r["correct_norm"] for r in per_model[a]],
                                                [r["correct_norm"] for r in per_model[b]])
        return out

    def report(self, result: dict) -> str:
        labels = result["labels"]
        head = ["metric"] + labels
        if len(labels) == 2:
            head += [f"Δ ({labels[1]} − {labels[0]})", "exact McNemar"]
        body = []
        for key, name, test in (("correct", "acc", "mcnemar"), ("correct_norm", "acc_norm", "mcnemar_norm")):
            cells = [name] + [pct(result["rows"][lab][key], result["rows"][lab]["n"]) for lab in labels]
            if len(labels) == 2:
                ra, rb = (result["rows"][lab] for lab in labels)
                t = result[test]
                cells += [f"{100 * (rb[key] - ra[key]) / ra['n']:+.2f}pt",
                          f"p = {fmt_p(t['p'])} (b={t['b']}, c={t['c']})"]
            body.append(cells)
        shots = (f"train q_ids {result['shot_ids']} before every question" if result["shot_sampling"] == "fixed"
                 else "shots drawn per question, in order, from one generator seeded with shot_seed")
        return (f"## JCommonsenseQA\n\n{markdown(head, body)}\n{result['n_questions']:,} questions, "
                f"{result['n_shots']}-shot ({shots}); score = summed log-likelihood of the continuation's tokens, "
                "split off the joint tokenisation of prompt + continuation; acc_norm divides by the choice's "
                "character length.\n")
