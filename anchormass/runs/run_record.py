"""What a logged run is traceable to, given to every logger as its hyper-parameters: the resolved
config, the model actually trained (its vocabulary comes from the data), the code and the data.

One flat dict of plain values (`optim.lr: 0.0006`, `model.vocab_size: 400`, `git_commit`,
`data_fingerprint`), the keys written as Hydra overrides are: TensorBoard's HPARAMS tab and W&B's
config show it as it is, and runs compare key by key. Lists are JSON text (`[0.9, 0.95]`); a run
without a checkout records the installed package's version as its code.
"""

from __future__ import annotations

import json
from typing import Any

from omegaconf import DictConfig, OmegaConf

from anchormass.utils import code_version


def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{'optim': {'lr': 1e-3, 'betas': [0.9, 0.95]}} -> {'optim.lr': 1e-3, 'optim.betas': '[0.9, 0.95]'}."""
    if not isinstance(tree, dict):
        value = tree if tree is None or isinstance(tree, (bool, int, float, str)) else json.dumps(tree, default=str)
        return {prefix: value}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def run_record(cfg: DictConfig, model_config: dict, data_fingerprint: str) -> dict[str, Any]:
    record = flat(OmegaConf.to_container(cfg, resolve=True))
    record.update(flat({"model": model_config}))
    record["git_commit"] = code_version()
    record["data_fingerprint"] = data_fingerprint
    return record


def log_run_record(loggers: list, record: dict[str, Any]) -> None:
    for logger in loggers:
        logger.log_hyperparams(record)
