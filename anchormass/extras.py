"""The optional parts of an installed package: which feature needs which extra, and the one line
that says so when it is missing (pyproject.toml [project.optional-dependencies] lists the same
extras; a checkout's requirements.txt installs all of them).

Checked before the work starts (a command-line choice before Hydra composes, a suite or an export
before a model loads), so a missing extra is never a traceback or Hydra's 12-line "could not load".
"""

from __future__ import annotations

import importlib.util

from anchormass.errors import ConfigError
from anchormass.utils import CHECKOUT

# extra -> the importable modules it brings (pyproject.toml)
EXTRAS = {
    "hf": ("transformers", "safetensors", "tokenizers"),  # and gguf, which only an import needs
    "eval": ("lm_eval", "accelerate", "transformers"),
    "loggers": ("tensorboard", "wandb"),
    "sweep": ("optuna", "hydra_plugins.hydra_optuna_sweeper"),
    "slurm": ("submitit", "hydra_plugins.hydra_submitit_launcher"),
    "data": ("datasets",),
}

# command-line choices that need an extra: (override, value) -> (extra, the modules it needs)
CHOICES = {
    ("suite", "lm_eval"): ("eval", EXTRAS["eval"]),
    ("logger", "tensorboard"): ("loggers", ("tensorboard",)),
    ("logger", "wandb"): ("loggers", ("wandb",)),
    ("hydra/sweeper", "optuna_optim"): ("sweep", EXTRAS["sweep"]),
    ("hydra/sweeper", "optuna"): ("sweep", EXTRAS["sweep"]),
    **{("hydra/launcher", name): ("slurm", EXTRAS["slurm"]) for name in ("slurm", "submitit_local", "submitit_slurm")},
}


class MissingExtra(ConfigError):
    """A feature whose optional dependencies are not installed (exit 2, one line)."""


def install_hint(extra: str) -> str:
    """How to get `extra` here: the pinned set in a checkout, the extra of an installed package."""
    return "pip install -r requirements.txt" if CHECKOUT is not None else f"pip install 'anchormass[{extra}]'"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


def require(extra: str, feature: str, modules: tuple[str, ...] | list[str] | None = None) -> None:
    """MissingExtra naming `feature`, what is missing and the command that installs it."""
    missing = [m for m in (modules or EXTRAS[extra]) if not _installed(m)]
    if missing:
        raise MissingExtra(f"{feature} needs {', '.join(m.split('.')[-1] for m in missing)}, not installed: "
                           f"{install_hint(extra)}")


def check_choices(argv: list[str]) -> None:
    """Every `group=choice` on the command line whose plugin or library is missing (sweeps'
    `logger=a,b` and lists `suite=[ppl,lm_eval]` choice by choice)."""
    for arg in argv:
        key, eq, value = arg.lstrip("+").partition("=")
        for choice in value.strip("[]").split(",") if eq else []:
            if (key, choice) in CHOICES:
                extra, modules = CHOICES[(key, choice)]
                require(extra, f"{key}={choice}", modules)
