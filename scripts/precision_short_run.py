#!/usr/bin/env python
"""Does bf16 autocast train the SmolLM2 retrofit like fp32? A short run of each (docs/method.md §6 l).

The retrofit recipe (configs/curriculum/retrofit_smollm2.yaml) trains under bf16 autocast because a
step costs about 0.45 of fp32's on this CPU (docs/results/smollm2/retrofit/step_time). One step's loss
agreeing is not a training run agreeing, so this trains the recipe's end-to-end g8 cell (`retro_1k`:
the retrieval-chosen import, lr 1e-4, 2 x 1,024 tokens a step) for a few steps three times, each a
train.py run of its own:
  fp32              the reference;
  bf16              bf16 autocast on the same batches in the same order;
  fp32_other_order  fp32 on other batches (seed 1): how far two fp32 runs land apart anyway.
and reports each step's training loss (as logged), the validation loss each run logged (under its own
precision), and, for the comparison, every final checkpoint scored again in fp32 on the held-out
perplexity anchors of docs/results/smollm2/classic (10 anchors x 1,023 targets, no prior context): per
anchor the difference to the fp32 run, its mean with a 95% t interval. bf16 passes when its mean
difference to fp32 is no larger than the difference two fp32 runs show on other batches.

    python scripts/precision_short_run.py [steps=12] [out=runs/precision_smollm2] [threads=1]
Writes <out>/<run>/ (each a train.py run folder) and <out>/precision.md, precision.json.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from anchormass.cli import exit_on_error, key_value_options
from anchormass.errors import ConfigError
from anchormass.utils import atomic_write_json, atomic_write_text

DEFAULTS = {"steps": "12", "out": "runs/precision_smollm2", "threads": "1"}
START = "imports/smollm2_retrieval2/model.ckpt"  # made by scripts/smollm2_retrofit.sh
HELD_OUT = "data/english_docs/val.bin"
ANCHORS = [27078, 45484, 65946, 83703, 108001, 125163, 149372, 171404, 198527, 236869]  # ../classic's ppl anchors
RUNS = {"fp32": (0, "32-true"), "bf16": (0, "bf16-mixed"), "fp32_other_order": (1, "32-true")}


def parse(argv: list[str]) -> dict:
    opts = key_value_options(argv, DEFAULTS)
    for key in ("steps", "threads"):
        if not opts[key].isdigit() or int(opts[key]) < 1:
            raise ConfigError(f"{key} must be a positive whole number, got {opts[key]!r}")
    return opts


def train_args(run_dir: Path, steps: int, seed: int, precision: str, threads: int) -> list[str]:
    """The recipe's retro_1k stage for the e2e_g8 cell, cut to `steps` steps, validated once at the end."""
    return ["stage=pretrain_1k", "model=anchormass_smollm2_135m", "model.n_local_heads=3", "model.n_global_heads=6",
            "data=english_docs", "data.out_dir=data/english_docs", "data.tokenizer.path=imports/smollm2/tokenizer",
            "trainer=cpu", f"trainer.precision={precision}", f"hydra.run.dir={run_dir}", "logger=csv",
            "stage.seq_len=1024", f"stage.total_steps={steps}", "stage.global_batch_size=2",
            "stage.micro_batch_size=1", "stage.lr=0.0001", f"stage.warmup_steps={max(1, steps // 9)}",
            f"stage.val_every={steps}", "stage.val_batches=8", f"stage.ckpt_every={steps}",
            "stage.datamodule.num_workers=0", "callbacks=plain_progress", "trainer.enable_progress_bar=false",
            f"init_from={START}", "init_across_arch=true", f"torch_threads={threads}", f"seed={seed}"]


def held_out_nll(run_dir: Path) -> list[float]:
    """Per anchor, the mean NLL of the run's final checkpoint, computed in fp32 whatever it trained in."""
    import torch

    from anchormass.data.token_file import open_tokens
    from anchormass.eval.suites.kv_frontier.perplexity import mean_nll
    from anchormass.training.checkpoint import load_model

    model, _ = load_model(run_dir / "checkpoints" / "last.ckpt")
    with torch.no_grad():
        return mean_nll(model.float().eval(), open_tokens(Path(HELD_OUT)), ANCHORS, 0, 1024)


def paired(a: list[float], b: list[float]) -> dict:
    """mean(b - a) over anchors with its 95% t interval."""
    from scipy import stats

    d = [y - x for x, y in zip(a, b)]
    mean, se = sum(d) / len(d), stats.sem(d)
    half = float(stats.t.ppf(0.975, len(d) - 1) * se)
    return {"mean": mean, "ci": [mean - half, mean + half], "n": len(d)}


def read_run(run_dir: Path) -> dict:
    """Training loss per step and the last held-out loss, from the run's CSV log (train/loss, val/loss)."""
    with open(run_dir / "logs" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    train = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    val = [float(r["val/loss"]) for r in rows if r.get("val/loss")]
    if not val:
        raise ConfigError(f"{run_dir}: no validation loss logged (did the run finish?)")
    return {"train_loss": train, "val_loss": val[-1]}


@exit_on_error
def main(argv: list[str]) -> None:
    opts = parse(argv)
    out, steps, threads = Path(opts["out"]), int(opts["steps"]), int(opts["threads"])
    if not Path(START).is_file():
        raise ConfigError(f"{START} is missing: scripts/smollm2_retrofit.sh makes it (the retrieval-chosen import)")
    results = {}
    for name, (seed, precision) in RUNS.items():
        run_dir = (out / name).resolve()
        if not (run_dir / "train_result.json").is_file():  # a finished run is read, not trained again
            print(f"{name}: training {steps} steps ({precision}, seed {seed}) -> {run_dir}", flush=True)
            subprocess.run([sys.executable, "train.py", *train_args(run_dir, steps, seed, precision, threads)],
                           check=True, stdout=subprocess.DEVNULL)
        results[name] = {**read_run(run_dir), "held_out_nll": held_out_nll(run_dir)}
    ref = results["fp32"]
    same = [abs(a - b) for a, b in zip(results["bf16"]["train_loss"], ref["train_loss"])]
    bf16 = paired(ref["held_out_nll"], results["bf16"]["held_out_nll"])
    order = paired(ref["held_out_nll"], results["fp32_other_order"]["held_out_nll"])
    summary = {"steps": steps, "runs": results, "bf16_minus_fp32_nll": bf16, "other_order_minus_fp32_nll": order,
               "bf16_vs_fp32_train_mean_abs": sum(same) / len(same),
               "within_noise": abs(bf16["mean"]) <= abs(order["mean"])}
    atomic_write_json(out / "precision.json", summary)
    rows = "\n".join(f"| {name} | {r['val_loss']:.4f} | {sum(r['held_out_nll']) / len(r['held_out_nll']):.4f} | "
                     f"{r['train_loss'][-1]:.4f} |" for name, r in results.items())

    def show(p):
        return f"{p['mean']:+.4f} [{p['ci'][0]:+.4f}, {p['ci'][1]:+.4f}]"

    text = (f"| run | validation loss logged at step {steps} (own precision) | held-out NLL, fp32 scoring "
            f"(10 anchors) | last training loss |\n| --- | ---: | ---: | ---: |\n{rows}\n\n"
            f"Held-out NLL per anchor, minus the fp32 run's (mean [95% t interval], n = {bf16['n']} anchors): "
            f"bf16 {show(bf16)}; fp32 on other batches {show(order)}. Mean |bf16 - fp32| training loss on the "
            f"same batches: {summary['bf16_vs_fp32_train_mean_abs']:.4f} over {len(same)} steps. bf16 within "
            f"the fp32-vs-fp32 difference: {'yes' if summary['within_noise'] else 'no'}.\n")
    atomic_write_text(out / "precision.md", text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
