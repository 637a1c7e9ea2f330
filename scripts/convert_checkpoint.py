"""Convert a checkpoint that the project now refuses (it holds Python objects) into a safe one:
`python scripts/convert_checkpoint.py trust=<file> [out=<file>]`.

Every checkpoint read goes through the weights-only unpickler (anchormass/training/safe_load.py);
a file written by an earlier version of the project with a DictConfig, a Path or numpy values in
it is refused in one line. This command UNPICKLES the file with the full unpickler, which runs any
code a crafted file holds, so it only runs on a file named with trust=: one you (or your own runs)
wrote. out= writes the converted checkpoint there (default: replace the file, atomically). See
anchormass/training/convert_checkpoint.py. Bad input exits 2 with one line.
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from anchormass.cli import check_overrides, exit_on_error, quoted_where_needed
from anchormass.utils import CONFIG_ROOT

ConfigStore.instance().store(name="convert_checkpoint", node={
    "trust": None, "out": None,
    "defaults": [{"override hydra/job_logging": "none"}, {"override hydra/hydra_logging": "none"}, "_self_"],
    "hydra": {"output_subdir": None, "run": {"dir": "."}},
})


@hydra.main(version_base="1.3", config_path=None, config_name="convert_checkpoint")
@exit_on_error
def main(cfg: DictConfig) -> None:
    from anchormass.training.convert_checkpoint import convert_command

    convert_command(cfg.trust, cfg.out)


if __name__ == "__main__":
    from anchormass.cli_help import exit_with_help

    exit_with_help(sys.argv[1:], "scripts/convert_checkpoint.py", __doc__, [])
    sys.argv[1:] = quoted_where_needed(sys.argv[1:])  # a non-ASCII path is a path
    check_overrides(CONFIG_ROOT, "convert_checkpoint", sys.argv[1:])
    main()
