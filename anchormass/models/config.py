"""Model configuration: one dataclass for both architectures, validated on construction.

Named presets live as YAML in `configs/model/<name>.yaml` (also Hydra's `model` group), so
`load_model_config("anchormass_tiny")` and `python train.py model=anchormass_tiny` read the
same file.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

from anchormass.errors import ConfigError
from anchormass.utils import CONFIG_ROOT

CONFIG_DIR = CONFIG_ROOT / "model"

ARCHS = ("standard", "anchormass")
SLOT_POLICIES = ("adaptive", "score_merge", "uniform_merge", "priority", "fifo")
MERGE_WEIGHTINGS = ("energy", "mass")
BACKGROUND_KEYS = ("anchor", "mean")
ATTN_IMPLS = ("auto", "block_sdpa", "flex")
# Field annotation (a string: postponed annotations) -> (accepted Python types, how to say it).
_FIELD_TYPES = {"int": (int, "an integer"), "float": ((int, float), "a number"), "bool": (bool, "true or false"),
                "str": (str, "a string")}


@dataclass
class ModelConfig:
    name: str = "custom"
    arch: str = "anchormass"  # "standard" | "anchormass"
    vocab_size: int = 28_000
    n_layers: int = 14
    d_model: int = 768
    n_heads: int = 12
    head_dim: int = 64
    ffn_dim: int = 2_560
    norm_eps: float = 1e-5
    init_std: float = 0.02

    # RoPE with dynamic NTK scaling (SPEC 1). original_max_len = longest trained length.
    rope_theta: float = 10_000.0
    original_max_len: int = 1_024

    # AnchorMass attention (SPEC 2); ignored by arch="standard".
    n_local_heads: int = 6  # heads [0, n_local) are local, the rest global
    n_global_heads: int = 6
    window: int = 64  # local sliding window (tokens, query included)
    block_size: int = 64  # C: global compression block
    group_size: int = 8  # G: tokens per stage-1 group
    n_sinks: int = 16  # S: raw sink tokens kept forever
    slot_budget: int = 8_192  # M_max: default stage-2 budget (slots)
    outlier_cos: float = 0.85
    outlier_rel_norm: float = 2.0

    # Ablations (SPEC 6, "ablations"): each a config override.
    outliers: bool = True  # False: never emit an outlier slot
    background_key: str = "anchor"  # "anchor" (last background token) | "mean" (mean key)
    mass_bias: bool = True  # False: no +log(mass) on global logits (mass-0 slots stay masked)

    # Stage 2 defaults used by new_cache(model) when no policy/budget is given.
    slot_policy: str = "adaptive"
    merge_weighting: str = "energy"  # "energy" | "mass"
    protect_fraction: float = 0.25  # most recent budget*fraction slots are never candidates

    # Kernels and inference.
    attn_impl: str = "auto"  # "auto" (flex on CUDA, block_sdpa elsewhere) | "block_sdpa" | "flex"
    prefill_chunk: int = 1_024
    # Training memory: recompute each block's activations in backward (parallel path only).
    activation_checkpointing: bool = False

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(f"model config '{self.name}': {msg}")

        for f in fields(self):  # types first: `window: x` is then one line, not a TypeError traceback
            value = getattr(self, f.name)
            accepted, what = _FIELD_TYPES[f.type]
            need(isinstance(value, accepted) and (f.type == "bool" or not isinstance(value, bool)),
                 f"{f.name} must be {what}, got {value!r}")
        need(self.arch in ARCHS, f"arch must be one of {ARCHS}, got {self.arch!r}")
        for f in ("vocab_size", "n_layers", "d_model", "n_heads", "head_dim", "ffn_dim",
                  "original_max_len", "prefill_chunk"):
            need(int(getattr(self, f)) > 0, f"{f} must be positive, got {getattr(self, f)}")
        need(self.head_dim % 2 == 0, f"head_dim must be even for RoPE, got {self.head_dim}")
        need(self.n_heads * self.head_dim == self.d_model,
             f"n_heads * head_dim = {self.n_heads * self.head_dim} must equal d_model = {self.d_model}")
        need(self.rope_theta > 0, f"rope_theta must be positive, got {self.rope_theta}")
        need(self.attn_impl in ATTN_IMPLS, f"attn_impl must be one of {ATTN_IMPLS}, got {self.attn_impl!r}")
        if self.arch != "anchormass":
            return
        need(self.n_local_heads >= 0 and self.n_global_heads >= 1,
             f"need n_local_heads >= 0 and n_global_heads >= 1, got {self.n_local_heads}/{self.n_global_heads}")
        need(self.n_local_heads + self.n_global_heads == self.n_heads,
             f"n_local_heads + n_global_heads = {self.n_local_heads + self.n_global_heads} "
             f"must equal n_heads = {self.n_heads}")
        need(self.window >= 1, f"window must be >= 1, got {self.window}")
        need(self.group_size >= 1, f"group_size must be >= 1, got {self.group_size}")
        need(self.block_size >= self.group_size and self.block_size % self.group_size == 0,
             f"block_size ({self.block_size}) must be a multiple of group_size ({self.group_size})")
        need(self.n_sinks >= 0, f"n_sinks must be >= 0, got {self.n_sinks}")
        need(self.slot_budget >= 4, f"slot_budget must be >= 4, got {self.slot_budget}")
        need(0.0 <= self.protect_fraction < 1.0, f"protect_fraction must be in [0, 1), got {self.protect_fraction}")
        need(self.slot_policy in SLOT_POLICIES, f"slot_policy must be one of {SLOT_POLICIES}, got {self.slot_policy!r}")
        need(self.merge_weighting in MERGE_WEIGHTINGS,
             f"merge_weighting must be one of {MERGE_WEIGHTINGS}, got {self.merge_weighting!r}")
        need(self.background_key in BACKGROUND_KEYS,
             f"background_key must be one of {BACKGROUND_KEYS}, got {self.background_key!r}")

    # ------------------------------------------------------------- derived
    @property
    def groups_per_block(self) -> int:
        return self.block_size // self.group_size

    @property
    def slots_per_block(self) -> int:
        """Fixed parallel layout: one background + one outlier slot per group."""
        return 2 * self.groups_per_block

    # ------------------------------------------------------------- (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConfig":
        data = dict(data)
        data.pop("_target_", None)  # tolerated: Hydra-style YAML
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"model config: unknown field(s) {unknown}; known fields are {sorted(known)}")
        return cls(**data)

    def replace(self, **changes: Any) -> "ModelConfig":
        return self.from_dict({**self.to_dict(), **changes})


def available_presets() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def load_model_config(spec: "str | Path | Mapping[str, Any] | ModelConfig") -> ModelConfig:
    """A preset name (`configs/model/<name>.yaml`), a YAML path, a mapping or a ModelConfig."""
    if isinstance(spec, ModelConfig):
        return spec
    if isinstance(spec, Mapping):
        return ModelConfig.from_dict(spec)
    try:  # DictConfig from Hydra
        from omegaconf import DictConfig, OmegaConf

        if isinstance(spec, DictConfig):
            return ModelConfig.from_dict(OmegaConf.to_container(spec, resolve=True))
    except ImportError:  # pragma: no cover - omegaconf ships with hydra-core
        pass
    path = Path(spec)
    if path.suffix not in (".yaml", ".yml"):
        path = CONFIG_DIR / f"{spec}.yaml"
    if not path.is_file():
        raise ConfigError(f"unknown model '{spec}': no {path}; presets: {', '.join(available_presets())}")
    import yaml

    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"model config {path} must be a mapping")
    return ModelConfig.from_dict(data)
