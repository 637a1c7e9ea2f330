"""The interface every evaluation suite implements, and the context a suite runs in.

A suite is constructed with its own config section (`cfg.eval.<name>`, a plain dict) and run by
`anchormass.eval.runner.run_evaluation`, which loads the models / tokenizer once, then for each suite:

    suite.check(ctx)            # validate inputs before anything runs (raise AnchorMassError)
    result = suite.run(ctx)     # {"summary": {...}, "items": [...], ...}: JSON-serialisable
    suite.report(result)        # Markdown section in the write-up's table layout
    suite.plots(result, dir)    # PNG files written into dir (may be none)
    suite.scalars(result)       # flat {name: float} for training-time loggers

`ctx.models` holds one model, or two when comparing (A = `ckpt`/`model`, B = `compare_ckpt`/
`compare_model`); a comparison scores both on identical items. A suite that does not apply to
the given models (e.g. the stage-2 policy study on a Standard-only run) says why from
`applies(ctx)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

import torch

from anchormass.errors import ConfigError


@dataclass
class EvalModel:
    """One model under evaluation plus where it came from."""

    label: str  # short name used in tables: e.g. "standard_tiny" or "A"
    model: torch.nn.Module
    config: Any  # ModelConfig
    source: str  # checkpoint path, or "random-init:<preset>"
    hparams: dict = field(default_factory=dict)
    max_context: int | None = None  # longest prompt accepted (limits.max_extrapolation); None: no limit
    sha256: str | None = None  # of the checkpoint file the weights were read from

    @property
    def arch(self) -> str:
        return self.config.arch


@dataclass
class EvalContext:
    models: list[EvalModel]
    tokenizer: Any | None  # anchormass.data.tokenizer.Tokenizer (None when no suite needs one)
    device: torch.device
    seed: int = 0
    progress: bool = True
    data_dir: Path | None = None  # folder with train.bin / val.bin (cfg.data_dir)
    # name -> {"path": ..., "sha256": ...}; suites record every data file they read.
    data: dict[str, dict] = field(default_factory=dict)
    record_data: Callable[[str, str | Path], None] | None = None

    @property
    def paired(self) -> bool:
        return len(self.models) == 2

    def need_tokenizer(self, suite: str):
        if self.tokenizer is None:
            raise ConfigError(f"suite '{suite}' needs a tokenizer: pass tokenizer=<path> "
                              "(or a checkpoint whose hparams name one)")
        return self.tokenizer

    def check_length(self, suite: str, length: int) -> None:
        """One clear line when a requested length exceeds what a model supports."""
        for m in self.models:
            if m.max_context is not None and length > m.max_context:
                raise ConfigError(f"{suite}: length {length} exceeds what model '{m.label}' supports "
                                  f"({m.max_context} tokens; see limits.max_extrapolation)")


class Suite:
    """Base class: subclasses set `name` and implement `run` (and usually `report`)."""

    name: ClassVar[str] = "suite"
    needs_tokenizer: ClassVar[bool] = False
    in_all: ClassVar[bool] = False  # run by suite=all (registry.all_suites); others only by name

    def __init__(self, cfg: dict | None = None):
        self.cfg = dict(cfg or {})

    def opt(self, key: str, default: Any = None) -> Any:
        return self.cfg.get(key, default)

    def applies(self, ctx: EvalContext) -> str | None:
        """None when the suite can run on ctx.models, else the reason it cannot (under
        suite=all the suite is then skipped; asked for by name it is an error)."""
        return None

    def check(self, ctx: EvalContext) -> None:
        """Validate every input (files, lengths, sizes) before anything runs; raise
        AnchorMassError with one line. Record data files with ctx.record_data(name, path)."""
        if self.needs_tokenizer:
            ctx.need_tokenizer(self.name)

    def run(self, ctx: EvalContext) -> dict:
        raise NotImplementedError

    def report(self, result: dict) -> str:
        return f"## {self.name}\n\n(no report)\n"

    def plots(self, result: dict, out_dir: Path) -> list[str]:
        return []

    def scalars(self, result: dict) -> dict[str, float]:
        out = {}
        for k, v in (result.get("summary") or {}).items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = float(v)
        return out
