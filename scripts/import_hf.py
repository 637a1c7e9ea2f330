"""Import a Hugging Face Llama (safetensors folder or GGUF file): `python scripts/import_hf.py src=<path> out=<dir>`.

The same command as `anchormass-import` once the package is installed; the code is
anchormass/commands/import_hf.py.
"""

from anchormass.commands.import_hf import cli

if __name__ == "__main__":
    cli()
