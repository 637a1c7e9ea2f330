#!/usr/bin/env python
"""Learning curve of in-context recall: train a model preset on a synthetic recall task (MQAR or
variable-distance copying) and print held-out accuracy against steps.

    python scripts/recall_probe.py                                   # standard_tiny on MQAR, 1000 steps
    python scripts/recall_probe.py task=copy preset=anchormass_tiny steps=2000
    python scripts/recall_probe.py 'preset_set={n_heads: 8, head_dim: 16, init_std: 0.08}'

Options: configs/recall_probe.yaml. Writes <out>/curve.csv, curve.json and curve.png (the work is
anchormass/commands/recall_probe.py). Use it to size a recipe before a study: a model that does
not retrieve here will not retrieve a passkey.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from anchormass.cli import check_group_choices, check_overrides, exit_on_error
from anchormass.utils import CONFIG_ROOT


@hydra.main(version_base="1.3", config_path=str(CONFIG_ROOT), config_name="recall_probe")
@exit_on_error
def main(cfg: DictConfig) -> None:
    from anchormass.commands.recall_probe import run_recall_probe

    run_recall_probe(cfg)


if __name__ == "__main__":
    check_group_choices(CONFIG_ROOT, sys.argv[1:])
    check_overrides(CONFIG_ROOT, "recall_probe", sys.argv[1:])  # an unknown key: one line, exit 2
    main()
