"""A Hugging Face Llama to import: a `transformers` folder (config.json + *.safetensors) or one GGUF file.

Both are read by `transformers` itself, offline and without remote code: the folder by
`from_pretrained(use_safetensors=True)` (a pickled `pytorch_model.bin` is never opened), the GGUF file
with the `gguf` package behind `from_pretrained(..., gguf_file=)`, which dequantises every tensor to
fp32 and undoes llama.cpp's interleaved Q/K row order (tests/test_hf_import.py checks both against the
raw GGUF tensor). The config is read first and on its own, so a model we refuse loads no weights.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

from anchormass.errors import ConfigError, DataError

GGUF_SUFFIX = ".gguf"
CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class LlamaSource:
    path: Path  # the folder, or the .gguf file
    kind: str  # "safetensors" | "gguf"

    def _where(self) -> tuple[str, dict]:
        """from_pretrained's (folder, options) for this source."""
        options = {"local_files_only": True, "trust_remote_code": False}
        if self.kind == "gguf":
            return str(self.path.parent), {**options, "gguf_file": self.path.name}
        return str(self.path), options

    def config(self):
        from transformers import AutoConfig

        folder, options = self._where()
        try:
            return AutoConfig.from_pretrained(folder, **options)
        except Exception as err:  # an unknown model_type or GGUF architecture, a damaged file
            raise ConfigError(f"src={self.path}: transformers cannot read its config "
                              f"({_first_line(err)})") from None

    def model(self):
        """The source as a `transformers` model in fp32, in eval mode."""
        import torch
        from transformers import AutoModelForCausalLM

        folder, options = self._where()
        if self.kind == "safetensors":
            options["use_safetensors"] = True
        # transformers' GGUF reader draws its own tqdm bar, which its logging settings do not silence
        quiet = contextlib.redirect_stderr(io.StringIO()) if self.kind == "gguf" else contextlib.nullcontext()
        try:
            with quiet:
                return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **options).eval()
        except Exception as err:  # whatever a damaged weight file makes its reader raise
            raise DataError(f"src={self.path}: transformers cannot load its weights ({_first_line(err)})") from None

    def tokenizer(self):
        from transformers import AutoTokenizer

        folder, options = self._where()
        try:
            return AutoTokenizer.from_pretrained(folder, **options)
        except Exception as err:  # as above, for the tokenizer files
            raise DataError(f"src={self.path}: transformers cannot read its tokenizer ({_first_line(err)})") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def open_source(src: str | Path) -> LlamaSource:
    """The source `src` names, checked to exist and to be one of the two kinds."""
    path = Path(src).expanduser()
    if path.is_file() and path.suffix.lower() == GGUF_SUFFIX:
        return LlamaSource(path, "gguf")
    if path.is_dir():
        if not (path / CONFIG_FILE).is_file():
            raise DataError(f"src={path}: a model folder must hold {CONFIG_FILE} (a save_pretrained folder)")
        if not any(path.glob("*.safetensors")):
            raise DataError(f"src={path}: no *.safetensors weights (pickled weight files are not read)")
        return LlamaSource(path, "safetensors")
    if path.exists():
        raise DataError(f"src={path}: neither a model folder nor a {GGUF_SUFFIX} file")
    raise DataError(f"src not found: {path}")
