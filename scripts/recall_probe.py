#!/usr/bin/env python
"""Learning curve of in-context recall: train a model preset on a synthetic recall task (MQAR or
variable-distance copying) and print held-out accuracy against steps.

    python scripts/recall_probe.py                                   # standard_tiny on MQAR, 1000 steps
    python scripts/recall_probe.py task=copy preset=anchormass_tiny steps=2000
    python scripts/recall_probe.py 'preset_set={n_heads: 8, head_dim: 16, init_std: 0.08}'

Options: configs/recall_probe.yaml. Writes <out>/curve.csv, curve.json and curve.png. Use it to
size a recipe before a study: a model that does not retrieve here will not retrieve a passkey.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from anchormass.cli import check_group_choices, exit_on_error
from anchormass.errors import ConfigError
from anchormass.utils import CONFIG_ROOT, atomic_write_json, atomic_write_text

FIELDS = ("step", "train_loss", "loss", "hits", "n", "accuracy", "chance", "seconds")


def plot(records: list[dict], title: str, path: Path) -> None:
    from anchormass.eval import report  # Agg backend

    fig, ax = report.plt.subplots(figsize=(6, 3.6))
    ax.plot([r["step"] for r in records], [r["accuracy"] for r in records], marker=".", label="held-out accuracy")
    ax.axhline(records[0]["chance"], color="grey", ls=":", label="chance")
    ax.set(xlabel="training step", ylabel="recall accuracy", ylim=(0, 1), title=title)
    ax.legend(loc="upper left")
    report.save_figure(fig, path)


@exit_on_error
def run(cfg: DictConfig) -> int:
    import torch

    from anchormass.eval.report import wilson_interval
    from anchormass.models import build_model
    from anchormass.models.config import read_preset
    from anchormass.training.recall_probe import ProbeConfig, steps_to, train_probe

    if int(cfg.threads) < 1:
        raise ConfigError(f"threads must be >= 1, got {cfg.threads}")
    torch.set_num_threads(int(cfg.threads))
    changes = {} if cfg.preset_set is None else OmegaConf.to_container(cfg.preset_set, resolve=True)
    if not isinstance(changes, dict):
        raise ConfigError(f"preset_set must be a mapping of model fields, e.g. '{{n_heads: 8}}', got {changes!r}")
    if "n_heads" in changes and "n_local_heads" not in changes:  # keep the preset's half/half head split
        changes["n_local_heads"] = int(changes["n_heads"]) // 2
        changes["n_global_heads"] = int(changes["n_heads"]) - changes["n_local_heads"]
    probe = ProbeConfig(**{k: OmegaConf.to_container(cfg[k]) if k in ("mqar", "copy") else cfg[k]
                           for k in ProbeConfig.__dataclass_fields__})
    probe.check(int(cfg.vocab_size))
    torch.manual_seed(int(cfg.seed))
    model = build_model({**read_preset(str(cfg.preset)), "vocab_size": int(cfg.vocab_size), **changes})
    name = Path(str(cfg.preset)).stem
    out = Path(cfg.out or f"outputs/recall_probe/{cfg.task}_{name}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"out: cannot use '{out}' ({err.strerror})") from None

    print(f"recall probe: {name} ({sum(p.numel() for p in model.parameters()):,} params), task {probe.task}, "
          f"{probe.steps} steps x {probe.batch_size} x {probe.seq_len} tokens, lr {probe.lr}, seed {probe.seed}")
    print(f"{'step':>6} {'train loss':>10} {'held-out loss':>13} {'accuracy':>9}  95% CI")

    def show(r: dict) -> None:
        lo, hi = wilson_interval(r["hits"], r["n"])
        print(f"{r['step']:>6} {r['train_loss']:>10.3f} {r['loss']:>13.3f} {r['accuracy']:>9.1%}  "
              f"[{lo:.1%}, {hi:.1%}]  ({r['seconds']:.0f} s)", flush=True)

    records = train_probe(model, probe, progress=show)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(records)
    atomic_write_text(out / "curve.csv", buf.getvalue())
    atomic_write_json(out / "curve.json", {"config": OmegaConf.to_container(cfg, resolve=True), "records": records})
    plot(records, f"{probe.task}: {name}", out / "curve.png")
    last = records[-1]
    first50 = steps_to(records, 0.5)
    print(f"chance {last['chance']:.2%}; final held-out accuracy {last['accuracy']:.1%} "
          f"({last['hits']}/{last['n']}); 50% reached at step {first50 if first50 is not None else 'never'}")
    print(f"curve: {out / 'curve.csv'}, {out / 'curve.png'}")
    return 0


@hydra.main(version_base="1.3", config_path=str(CONFIG_ROOT), config_name="recall_probe")
def main(cfg: DictConfig) -> None:
    run(cfg)


if __name__ == "__main__":
    check_group_choices(CONFIG_ROOT, sys.argv[1:])
    main()
