"""Training-time evaluation: the same suites as evaluate.py, cheap settings, every N steps.

Add to a training config's callbacks group, e.g.

    eval:
      _target_: anchormass.eval.callbacks.EvalCallback
      every_n_steps: 200
      suites: [ppl, passkey]
      preset: cpu_tiny            # configs/eval/<preset>.yaml; `overrides` deep-merges on top
      data_dir: ${data_dir}       # val.bin for ppl (train.yaml's data folder)
      tokenizer: null             # default: the LightningModule's hparams.tokenizer_path

Runs on global rank 0 only (the live model, no checkpoint round trip), writes the usual
results.json / report.md under `<out_root>/step<N>` and logs every suite's scalars to all the
trainer's loggers as `eval/<suite>/<name>`.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback
from omegaconf import OmegaConf

from anchormass.config_compose import compose_file
from anchormass.eval.registry import make_suite
from anchormass.eval.suite import EvalModel
from anchormass.utils import CONFIG_ROOT

EVAL_CONFIG_DIR = CONFIG_ROOT / "eval"


def load_preset(name: str, overrides: dict | None = None) -> dict:
    """An eval size preset (`configs/eval/<name>.yaml`) outside Hydra, composed as Hydra composes
    the `eval` group (anchormass/config_compose.py): a preset's `defaults: [<other>, _self_]` merges
    the other preset first, then the file's own keys on top."""
    merged = compose_file(name, EVAL_CONFIG_DIR, "eval preset")
    if overrides:
        merged = OmegaConf.merge(merged, OmegaConf.create(overrides))
    return OmegaConf.to_container(merged, resolve=True)


class EvalCallback(Callback):
    def __init__(self, every_n_steps: int = 500, suites: list[str] | tuple[str, ...] = ("ppl",),
                 preset: str = "cpu_tiny", overrides: dict | None = None, data_dir: str | None = None,
                 tokenizer: str | None = None, out_root: str = "runs/eval_callback", at_end: bool = True,
                 max_extrapolation: float | None = 8, prefix: str = "eval"):
        self.every = int(every_n_steps)
        self.suites = list(suites)
        self.eval_cfg = load_preset(preset, overrides)
        self.data_dir, self.tokenizer = data_dir, tokenizer
        self.out_root, self.at_end, self.prefix = Path(out_root), at_end, prefix
        self.max_extrapolation = max_extrapolation
        self._last_step = -1

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if self.every > 0 and step > 0 and step % self.every == 0:
            self.evaluate(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.at_end:
            self.evaluate(trainer, pl_module)

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Path | None:
        """Run the suites on the live model now; returns the output folder (None off rank 0)."""
        step = trainer.global_step
        if not trainer.is_global_zero or step == self._last_step:
            return None
        self._last_step = step
        from anchormass.eval.runner import run_evaluation

        model = pl_module.model
        hp = dict(pl_module.hparams)
        limit = None if self.max_extrapolation is None else int(self.max_extrapolation * model.cfg.original_max_len)
        em = EvalModel(label=model.cfg.name, model=model, config=model.cfg, source=f"training step {step}",
                       hparams=hp, max_context=limit)
        cfg = {"suite": self.suites, "eval": self.eval_cfg, "data_dir": self.data_dir,
               "tokenizer": self.tokenizer or hp.get("tokenizer_path"), "progress": False,
               "out_dir": str(self.out_root / f"step{step:07d}"), "overwrite": True, "seed": 0}
        out = run_evaluation(cfg, models=[em])
        self._log(trainer, out, step)
        return out

    def _log(self, trainer: L.Trainer, out: Path, step: int) -> None:
        import json

        results = json.loads((out / "results.json").read_text(encoding="utf-8"))["suites"]
        metrics = {}
        for name, res in results.items():
            if "skipped" in res:
                continue
            for key, value in make_suite(name, self.eval_cfg.get(name)).scalars(res).items():
                metrics[f"{self.prefix}/{name}/{key}"] = value
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
        self.last_metrics = metrics
