"""lm-evaluation-harness tasks on our checkpoints (`evaluate.py suite=lm_eval tasks=[jcqa_local] ckpt=...`).

Each model runs through the harness's own `HFLM` backend wrapped around our model
(anchormass.hf.modeling: the same forward the exported remote-code folder runs) and the
exported tokenizer (our ids), so the harness builds the prompts, tokenises, batches and scores.
Its metrics land in results.json (`summary["<model>/<task>/<metric>"]`) and in the report.
`jcqa_local` is JCommonsenseQA from local JGLUE files with the harness's leaderboard prompt
(anchormass/hf/lm_eval_tasks.py); other task names go to the harness as they are (their data
must then be reachable).
"""

from __future__ import annotations

import contextlib
import io
import logging

from anchormass.errors import ConfigError, DataError
from anchormass.eval.report import markdown
from anchormass.eval.suite import EvalContext, Suite


def harness_model(m, tokenizer, device, batch_size: int):
    """An lm_eval HFLM over our model `m` (EvalModel) and the exported tokenizer."""
    from lm_eval.models.huggingface import HFLM

    from anchormass.hf.export_anchormass import hf_wrapper
    from anchormass.hf.tokenizer_export import hf_tokenizer

    hf = hf_wrapper(m.model, tokenizer.special_ids())
    # HFLM warns that an in-memory model is not a hub name and not a registered CausalLM: both
    # expected here, and lines that would bury a real error.
    harness_log = logging.getLogger("lm_eval")
    level = harness_log.level
    harness_log.setLevel(logging.ERROR)
    try:
        return HFLM(pretrained=hf, tokenizer=hf_tokenizer(tokenizer), batch_size=batch_size, device=str(device))
    finally:
        harness_log.setLevel(level)


def check_task_names(names: list[str], known: list[str]) -> None:
    """An unknown task is one line naming it (and the nearest names), before any model runs."""
    import difflib

    from anchormass.hf.lm_eval_tasks import LOCAL_TASKS

    for name in names:
        if name not in known:
            near = difflib.get_close_matches(name, known, n=3)
            hint = f"did you mean {', '.join(near)}? " if near else ""
            raise ConfigError(f"unknown lm_eval task '{name}' in tasks=[...]; {hint}`lm_eval ls tasks` lists the "
                              f"harness's tasks, and {', '.join(LOCAL_TASKS)} reads local files")


@contextlib.contextmanager
def hub_errors_as_one_line(tasks: list[str]):
    """A harness task whose data lives only on the Hugging Face Hub fails deep inside `datasets`
    when the hub cannot be reached (HF_DATASETS_OFFLINE=1, no network); say so in one line."""
    from anchormass.hf.lm_eval_tasks import LOCAL_TASKS

    try:
        yield
    except ConnectionError as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(f"lm_eval tasks {tasks}: a dataset could not be fetched from the Hugging Face Hub ({reason}); "
                        f"run once with network access so `datasets` caches it, or use a local task "
                        f"({', '.join(LOCAL_TASKS)})") from None


class LmEvalSuite(Suite):
    name = "lm_eval"
    needs_tokenizer = True

    def applies(self, ctx: EvalContext) -> str | None:
        if not self.opt("tasks"):
            return "no harness tasks: pass tasks=[jcqa_local,...]"
        return None

    def check(self, ctx: EvalContext) -> None:
        super().check(ctx)
        from anchormass.extras import require

        require("eval", "suite lm_eval")
        from anchormass.hf.lm_eval_tasks import jcqa_files, task_specs

        tasks = self.opt("tasks")
        self.tasks = [tasks] if isinstance(tasks, str) else list(tasks)
        if "jcqa_local" in self.tasks:
            for split, path in jcqa_files(self.opt("jcqa_dir")).items():
                ctx.record_data(f"jcqa_{split}", path)
        limit = self.opt("limit")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ConfigError(f"lm_eval.limit must be a positive integer or null, got {limit!r}")
        self.specs = task_specs(self.tasks, self.opt("jcqa_dir"))
        from lm_eval.tasks import TaskManager

        # Indexing the harness's thousands of task files takes a while: only when a task needs them.
        self.manager = TaskManager(include_defaults=any(isinstance(s, str) for s in self.specs))
        check_task_names([s for s in self.specs if isinstance(s, str)], self.manager.all_tasks)

    def run(self, ctx: EvalContext) -> dict:
        import lm_eval

        per_model, n_samples, configs, items = {}, {}, {}, []
        manager = self.manager
        for m in ctx.models:
            lm = harness_model(m, ctx.tokenizer, ctx.device, int(self.opt("batch_size", 1)))
            # The harness draws its own progress bars on stderr; keep them only when asked for.
            quiet = contextlib.nullcontext() if ctx.progress else contextlib.redirect_stderr(io.StringIO())
            with quiet, hub_errors_as_one_line(self.tasks):
                out = lm_eval.simple_evaluate(
                    model=lm, tasks=self.specs, num_fewshot=self.opt("num_fewshot"), limit=self.opt("limit"),
                    task_manager=manager, random_seed=ctx.seed, fewshot_random_seed=int(self.opt("fewshot_seed", 1234)),
                    log_samples=True, verbosity="ERROR")
            per_model[m.label] = {task: {k: float(v) for k, v in res.items() if isinstance(v, (int, float))
                                         and not isinstance(v, bool)} for task, res in out["results"].items()}
            # Per question: the harness's own per-item metrics (paired comparisons with suite=jcqa).
            for task, samples in out.get("samples", {}).items():
                items += [{"model": m.label, "task": task, "doc_id": smp["doc_id"],
                           **{k: float(smp[k]) for k in ("acc", "acc_norm") if k in smp},
                           "loglik": [float(r[0][0]) for r in smp["resps"]]} for smp in samples]
            n_samples = {task: dict(v) for task, v in out.get("n-samples", {}).items()}
            configs = {task: {k: cfg.get(k) for k in ("num_fewshot", "description", "doc_to_text",
                                                      "target_delimiter", "fewshot_delimiter")}
                       for task, cfg in out.get("configs", {}).items()}
        summary = {f"{lab}/{task}/{metric.split(',')[0]}": value for lab, res in per_model.items()
                   for task, metrics in res.items() for metric, value in metrics.items()
                   if "stderr" not in metric and metric.endswith(",none")}
        return {"labels": list(per_model), "tasks": self.tasks, "results": per_model, "n_samples": n_samples,
                "task_configs": configs, "harness_version": lm_eval.__version__, "summary": summary, "items": items}

    def report(self, result: dict) -> str:
        labels = result["labels"]
        body = []
        for task in result["tasks"]:
            first = result["results"][labels[0]].get(task, {})
            for metric in sorted(k for k in first if k.endswith(",none") and "stderr" not in k):
                cells = [task, metric.split(",")[0]]
                for lab in labels:
                    res = result["results"][lab][task]
                    err = res.get(metric.replace(",", "_stderr,"))
                    cells.append(f"{100 * res[metric]:.2f}" + (f" ± {100 * err:.2f}" if err else ""))
                body.append(cells)
        n = "; ".join(f"{t}: {v.get('effective')} of {v.get('original')}" for t, v in result["n_samples"].items())
        return (f"## lm-evaluation-harness\n\n{markdown(['task', 'metric', *labels], body)}\n"
                f"lm_eval {result['harness_version']}; items scored: {n}; percent ± the harness's standard error.\n")
