"""Train one stage: `python train.py [experiment=...] [model=...] [stage=...] [overrides]`.

The same command as `anchormass-train` once the package is installed; the code is
anchormass/commands/train.py (its docstring lists sweeps and launchers).
"""

from anchormass.commands.train import cli

if __name__ == "__main__":
    cli()
