"""Prepare a dataset: `python scripts/prepare_data.py data=<name> [data.key=value ...]`.

The same command as `anchormass-prepare` once the package is installed; the code is
anchormass/commands/prepare_data.py.
"""

from anchormass.commands.prepare_data import cli

if __name__ == "__main__":
    cli()
