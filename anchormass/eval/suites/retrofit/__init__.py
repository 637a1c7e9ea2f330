"""(j) Recall against compression on the retrofit route: docs/method.md §6 j.

Every cell of the study is a trained run folder (`cells`: {label, run, shape, tags}; `run` is
`<model>/<stage>` beside model A's run folder, i.e. in the same seed's folder; `tags`: `frontier`
puts the cell on the recall-against-bytes line of its shape, `g8` on the recall-against-heads plot).
A cell whose run has not finished (not trained under this seed, or still training) is left out and
listed. Each is scored on the same passkey trials (identical items for every cell; greedy decoding through the inference
cache), and per cell the suite also measures the stored KV bytes of one sequence at `bytes_length`
tokens, what stage 1 kept of the key's digits in one parallel forward (anchormass/eval/suites/retrofit/slot_probe.py),
and the answer-token validation loss against steps over the cell's chain of stages (its CSV logs).
Over the training seeds the aggregate hook pools each cell (pool.py): mean ± std over seeds, pooled
Wilson intervals, exact McNemar against the shape's Standard and against its lossless g1 cell over
(seed, trial) pairs, and the two plots (recall against stored bytes; recall at g8 against the number
of global heads).
"""

from __future__ import annotations

from pathlib import Path

from anchormass.errors import ConfigError
from anchormass.eval.items import DEFAULT_DEPTHS, build_haystack, run_trials, tally, trial_grid
from anchormass.eval.suite import EvalContext, EvalModel, Suite
from anchormass.eval.suites.retrofit.cells import cell_info, learning_curve, slot_diagnostics, stored_bytes
from anchormass.runs.layout import finished_run, last_checkpoint, seed_folder_of


class RetrofitSuite(Suite):
    name = "retrofit"
    needs_tokenizer = True

    def check(self, ctx: EvalContext) -> None:
        super().check(ctx)
        self.lengths = [int(x) for x in self.opt("lengths", [512, 1024, 2048, 4096, 8192])]
        self.trained = int(self.opt("trained_length", 2048))
        self.depths = [float(d) for d in self.opt("depths", DEFAULT_DEPTHS)]
        self.seeds = [int(s) for s in self.opt("seeds", [0, 1, 2])]
        cells = [dict(c) for c in self.opt("cells") or []]
        if not cells or any(not c.get("label") or not c.get("run") or not c.get("shape") for c in cells):
            raise ConfigError("retrofit.cells: a non-empty list of {label, run: <model>/<stage>, shape}")
        labels = [c["label"] for c in cells]
        if len(set(labels)) < len(labels):
            raise ConfigError(f"retrofit.cells: labels must be distinct, got {labels}")
        if self.trained not in self.lengths:
            raise ConfigError(f"retrofit.trained_length {self.trained} must be one of lengths {self.lengths}")
        source = Path(ctx.models[0].source)
        if not source.is_file():
            raise ConfigError("retrofit: model A must be loaded from a run's checkpoint (ckpt=)")
        self.root = seed_folder_of(source)
        self.cells = [c for c in cells if finished_run(self.root / c["run"])]
        self.left_out = [c["label"] for c in cells if c not in self.cells]
        self.hay = build_haystack(self, ctx)
        self.trials = trial_grid(self.lengths, self.depths, self.seeds, jitter=bool(self.opt("jitter", True)))
        for t in self.trials:
            self.hay.build(t)  # a too-short length fails here, before any model runs

    def _load(self, ctx: EvalContext, cell: dict) -> EvalModel:
        from anchormass.eval.loading import load_one

        dtype = next(ctx.models[0].model.parameters()).dtype
        m = load_one(str(last_checkpoint(self.root / cell["run"])), None, f"retrofit {cell['label']}",
                     ctx.device, dtype, ctx.seed)
        m.label = cell["label"]
        return m

    def run(self, ctx: EvalContext) -> dict:
        records, models, curves, probe, nbytes = [], {}, {}, {}, {}
        probe_trials = [t for t in self.trials if t.length == self.trained]
        for cell in self.cells:
            m = self._load(ctx, cell)
            records += run_trials(ctx, m, self.hay, self.trials, max_new_tokens=int(self.opt("max_new_tokens", 8)),
                                  batch_size=int(self.opt("batch_size", 5)), desc="retrofit")
            models[m.label] = cell_info(m, cell)
            nbytes[m.label] = stored_bytes(m.model, self.hay.build(probe_trials[0]))
            probe[m.label] = slot_diagnostics(m.model, self.hay, probe_trials, ctx.tokenizer)
            curves[m.label] = learning_curve(self.root / cell["run"])
        labels = list(models)
        by_length = {lab: {L: tally([r for r in records if r["model"] == lab and r["length"] == L])
                           for L in self.lengths} for lab in labels}
        summary = {f"{lab}/len{L}/exact": c["exact"] / c["n"] for lab in labels for L, c in by_length[lab].items()
                   if c["n"]}
        return {"labels": labels, "models": models, "lengths": self.lengths, "trained_length": self.trained,
                "depths": self.depths, "seeds": self.seeds, "filler": self.hay.filler, "by_length": by_length,
                "stored_bytes": nbytes, "bytes_length": self.trained, "probe": probe, "curves": curves,
                "left_out": self.left_out,
                "items": [{k: r[k] for k in ("model", "length", "depth", "seed", "exact", "digits")} for r in records],
                "summary": summary}

    def report(self, result: dict) -> str:
        from anchormass.eval.suites.retrofit.pool import pool_seeds

        return pool_seeds([result], [None])["markdown"]

    def plots(self, result: dict, out_dir: Path) -> list[str]:
        from anchormass.eval.suites.retrofit.pool import pool_seeds

        return pool_seeds([result], [None])["plots"](out_dir)

    @classmethod
    def aggregate(cls, per_seed: list[dict], seeds: list[int]) -> dict:
        from anchormass.eval.suites.retrofit.pool import pool_seeds

        return pool_seeds(per_seed, seeds)

    @classmethod
    def merge(cls, runs: list[dict]) -> dict:
        from anchormass.eval.suites.retrofit.pool import merge_runs

        return merge_runs(runs)
