"""Evaluate one model, or compare two on identical items: `python evaluate.py suite=... ckpt=...`.

The same command as `anchormass-eval` once the package is installed; the code is
anchormass/commands/evaluate.py.
"""

from anchormass.commands.evaluate import cli

if __name__ == "__main__":
    cli()
