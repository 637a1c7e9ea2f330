"""Export a checkpoint for Hugging Face `transformers`: `python scripts/export_hf.py ckpt=<path> out=<dir>`.

The same command as `anchormass-export` once the package is installed; the code is
anchormass/commands/export_hf.py.
"""

from anchormass.commands.export_hf import cli

if __name__ == "__main__":
    cli()
