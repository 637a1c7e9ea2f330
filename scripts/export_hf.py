"""Export a checkpoint for Hugging Face `transformers`: `python scripts/export_hf.py ckpt=<path> out=<dir>`.

The same command as `anchormass-export` once the package is installed; the code is
anchormass/commands/export_hf.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from anchormass.commands.export_hf import cli  # noqa: E402

if __name__ == "__main__":
    cli()
