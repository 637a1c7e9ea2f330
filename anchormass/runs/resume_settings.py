"""A resume trains with the settings its checkpoint recorded, or changes them by name.

Lightning restores the optimizer's param groups (lr, betas, eps, weight decay) and the scheduler's
base lrs from the checkpoint, so `stage.lr=1e-3` on a resume used to be written into the new
checkpoint's hyper-parameters while the old rate went on. Now a resume whose optimiser, schedule
or data settings (RESUME_KEYS) differ from its checkpoint's is refused in one line naming each
key, unless the key is listed in `resume_overrides=[...]`; then the new value really is used from
the resume step on (`ResumeOverrides` re-applies the optimiser settings after Lightning's restore,
the datamodule accepts the changed order) and every checkpoint written afterwards records the
change in `hyper_parameters.resume_overrides` (step, key, old and new value) besides the new value.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from anchormass.errors import ConfigError

OPTIM_KEYS = ("lr", "weight_decay", "betas", "eps", "warmup_steps", "min_lr_ratio")
# Settings that change what a resumed run computes. `data` is the prepared data's fingerprint.
RESUME_KEYS = (*(f"optim.{k}" for k in OPTIM_KEYS), "stage.total_steps", "stage.seq_len",
               "stage.global_batch_size", "seed", "data")
# What users also type: configs/train.yaml sets optim.lr / optim.warmup_steps from the stage's.
ALIASES = {"stage.lr": "optim.lr", "stage.warmup_steps": "optim.warmup_steps"}
DATA_KEYS = ("stage.seq_len", "stage.global_batch_size", "seed", "data")


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


def _datamodule_order(ckpt: dict) -> dict:
    """The data order settings the datamodule saved (anchormass/data/datamodule.py state_dict)."""
    for value in ckpt.values():
        if isinstance(value, dict) and isinstance(value.get("order"), dict) and "next_step" in value:
            return value["order"]
    return {}


def checkpoint_settings(ckpt: dict) -> dict[str, Any]:
    hp = ckpt["hyper_parameters"]
    found = {f"optim.{k}": _plain(v) for k, v in (hp.get("optim") or {}).items() if k in OPTIM_KEYS}
    order = _datamodule_order(ckpt)
    found.update({"stage.total_steps": hp.get("total_steps"), "stage.seq_len": hp.get("seq_len"),
                  "stage.global_batch_size": order.get("global_batch_size"), "seed": order.get("seed"),
                  "data": hp.get("data_fingerprint")})
    return {k: v for k, v in found.items() if v is not None}  # older checkpoints lack some


def current_settings(cfg: DictConfig, data_fingerprint: str) -> dict[str, Any]:
    optim = OmegaConf.to_container(cfg.optim, resolve=True)
    dm = cfg.stage.datamodule
    return {**{f"optim.{k}": _plain(optim.get(k)) for k in OPTIM_KEYS},
            "stage.total_steps": int(cfg.stage.total_steps), "stage.seq_len": int(cfg.stage.seq_len),
            "stage.global_batch_size": int(dm.get("global_batch_size", cfg.stage.global_batch_size)),
            "seed": int(dm.get("seed", cfg.seed)), "data": data_fingerprint}


def _show(key: str, value: Any) -> str:
    return f"fingerprint {str(value)[:12]}" if key == "data" else repr(value)


def requested_overrides(cfg: DictConfig) -> set[str]:
    names = cfg.get("resume_overrides") or []
    if isinstance(names, str):
        names = [names]
    unknown = [n for n in names if ALIASES.get(n, n) not in RESUME_KEYS]
    if unknown:
        raise ConfigError(f"resume_overrides: unknown key(s) {unknown}; each must be one of {list(RESUME_KEYS)}")
    return {ALIASES.get(n, n) for n in names}


def check_resume_settings(ckpt: dict, cfg: DictConfig, data_fingerprint: str, path: str) -> list[dict]:
    """Refuse a resume that changes settings without naming them; the named changes, as records
    {key, checkpoint, now, step}. A named data change lets the datamodule accept the new order."""
    before, now = checkpoint_settings(ckpt), current_settings(cfg, data_fingerprint)
    differ = [k for k in RESUME_KEYS if k in before and before[k] != now[k]]
    allowed = requested_overrides(cfg)
    refused = [k for k in differ if k not in allowed]
    step = int(ckpt.get("global_step", 0))
    if refused:
        detail = "; ".join(f"{k}: {_show(k, before[k])} in the checkpoint vs {_show(k, now[k])} now" for k in refused)
        raise ConfigError(f"ckpt_path={path} was trained with other settings ({detail}); resume with the "
                          f"checkpoint's values, or change them from step {step} on with "
                          f"resume_overrides=[{','.join(refused)}]")
    changes = [{"step": step, "key": k, "checkpoint": before[k], "now": now[k]} for k in differ]
    if any(c["key"] in DATA_KEYS for c in changes):
        with open_dict(cfg.stage.datamodule):
            cfg.stage.datamodule.allow_data_change = True
    return changes


class ResumeOverrides(Callback):
    """Makes the named changes take effect after Lightning's restore, and keeps their record."""

    def __init__(self, changes: list[dict] | None = None):
        self.changes = list(changes or [])
        self.history: list[dict] = []

    def state_dict(self) -> dict:
        return {"history": self.history}

    def load_state_dict(self, state: dict) -> None:
        self.history = list(state.get("history", []))

    def on_train_start(self, trainer, pl_module) -> None:
        if not self.changes:
            return
        self.history += self.changes
        keys = {c["key"] for c in self.changes}
        if any(k.startswith("optim.") or k == "stage.total_steps" for k in keys):
            self._reapply_optim(trainer, pl_module.hparams.optim)
        for c in self.changes:
            print(f"note: resuming at step {c['step']} with {c['key']} = {_show(c['key'], c['now'])} "
                  f"(the checkpoint had {_show(c['key'], c['checkpoint'])})")
        self.changes = []

    @staticmethod
    def _reapply_optim(trainer, optim: dict) -> None:
        # The restored param groups hold the checkpoint's values; the lambdas (warmup, cosine over
        # total_steps) are the new module's. Group 0 is the decayed one (training/optim.py param_groups).
        sched = trainer.lr_scheduler_configs[0].scheduler
        opt = trainer.optimizers[0]
        sched.base_lrs = [float(optim["lr"])] * len(opt.param_groups)
        for i, group in enumerate(opt.param_groups):
            group["initial_lr"] = float(optim["lr"])
            group["betas"], group["eps"] = tuple(optim["betas"]), float(optim["eps"])
            if i == 0:
                group["weight_decay"] = float(optim["weight_decay"])
            group["lr"] = sched.base_lrs[i] * sched.lr_lambdas[i](sched.last_epoch)
        sched._last_lr = [group["lr"] for group in opt.param_groups]

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        if self.history:
            checkpoint["hyper_parameters"]["resume_overrides"] = list(self.history)
