"""Model configuration: one dataclass for both architectures, validated on construction.

The values live in YAML, `configs/model/` (also Hydra's `model` group): `base.yaml` states every
field once (the 158M AnchorMass model of docs/method.md §1), and each preset lists only what
differs from the configs it names in its `defaults` list. `load_model_config("anchormass_tiny")`
and `python train.py model=anchormass_tiny` read the same files and give the same config.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, Mapping, Optional, Union

from anchormass.config_compose import compose_file, group_names
from anchormass.errors import ConfigError
from anchormass.utils import CONFIG_ROOT

CONFIG_DIR = CONFIG_ROOT / "model"
BASE_PRESET = "base"

# The enumerated fields: the one list of accepted names (the cache's policy registry checks
# itself against SlotPolicyName).
Arch = Literal["standard", "anchormass"]
SlotPolicyName = Literal["adaptive", "score_merge", "uniform_merge", "priority", "fifo"]
MergeWeighting = Literal["energy", "mass"]
BackgroundKey = Literal["anchor", "mean"]
AttnImpl = Literal["auto", "block_sdpa", "flex"]
OutlierScorer = Literal["rule", "learned"]
ARCHS, SLOT_POLICIES = typing.get_args(Arch), typing.get_args(SlotPolicyName)
MERGE_WEIGHTINGS, BACKGROUND_KEYS, ATTN_IMPLS, OUTLIER_SCORERS = (
    typing.get_args(t) for t in (MergeWeighting, BackgroundKey, AttnImpl, OutlierScorer))
# Plain field types -> (accepted Python types, how to say it).
_PLAIN_TYPES = {int: (int, "an integer"), float: ((int, float), "a number"), bool: (bool, "true or false"),
                str: (str, "a string")}


def check_protect_fraction(value: float) -> None:
    """Stage 2 protects the most recent budget * fraction slots; the fraction must leave candidates."""
    if not 0.0 <= value < 1.0:
        raise ConfigError(f"protect_fraction must be in [0, 1), got {value}")


@dataclass
class ModelConfig:
    """Every field is required here; the values come from configs/model/ (base.yaml + a preset)."""

    name: str
    arch: Arch
    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int  # query heads
    # Key/value heads (grouped-query attention, docs/method.md §1): each serves n_heads / n_kv_heads
    # consecutive query heads. null: one per query head (multi-head attention).
    n_kv_heads: Optional[int]
    head_dim: int
    ffn_dim: int
    norm_eps: float
    init_std: float
    tie_embeddings: bool  # the LM head reuses the embedding matrix (one parameter)

    # RoPE with dynamic NTK scaling (docs/method.md §1). original_max_len = longest trained length.
    rope_theta: float
    original_max_len: int

    # AnchorMass attention (docs/method.md §2); ignored by arch="standard".
    # Query heads [0, n_local) are local, the rest global; with GQA both are whole KV groups.
    n_local_heads: int
    n_global_heads: int
    window: int  # local sliding window (tokens, query included)
    block_size: int  # C: global compression block
    group_size: int  # G: tokens per stage-1 group
    n_sinks: int  # S: raw sink tokens kept forever
    slot_budget: int  # M_max: default stage-2 budget (slots)
    outlier_cos: float
    outlier_rel_norm: float
    # Which token of a group stage 1 keeps exact: "rule" (docs/method.md §2.3: the one least like
    # the group's mean value, when it passes the thresholds above) | "learned" (a per-layer scorer
    # on the values picks one in every group, trained straight-through).
    outlier_scorer: OutlierScorer

    # Ablations (docs/method.md §6, "ablations"): each a config override.
    outliers: bool  # False: never emit an outlier slot
    background_key: BackgroundKey  # "anchor" (last background token) | "mean" (mean key)
    mass_bias: bool  # False: no +log(mass) on global logits (mass-0 slots stay masked)

    # Stage 2 defaults used by anchormass.cache.new_cache when no policy/budget is given.
    slot_policy: SlotPolicyName
    merge_weighting: MergeWeighting
    protect_fraction: float  # most recent budget*fraction slots are never candidates

    # Kernels and inference.
    attn_impl: AttnImpl  # "auto" (flex on CUDA, block_sdpa elsewhere) | "block_sdpa" | "flex"
    prefill_chunk: int
    # Training memory: recompute each block's activations in backward (parallel path only).
    activation_checkpointing: bool

    def __post_init__(self) -> None:
        # One spelling per model: as many KV heads as query heads is plain multi-head attention,
        # null, so configs, checkpoints and comparisons between them agree.
        if type(self.n_kv_heads) is int and self.n_kv_heads == self.n_heads:
            self.n_kv_heads = None
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ConfigError(f"model config '{self.name}': {msg}")

        for name, kind in _field_types().items():  # types first: `window: x` is one line, not a traceback
            value = getattr(self, name)
            if typing.get_origin(kind) is Union:  # Optional[x]: null, or an x
                if value is None:
                    continue
                kind = next(a for a in typing.get_args(kind) if a is not type(None))
            if typing.get_origin(kind) is Literal:
                need(value in typing.get_args(kind), f"{name} must be one of {typing.get_args(kind)}, got {value!r}")
                continue
            accepted, what = _PLAIN_TYPES[kind]
            need(isinstance(value, accepted) and (kind is bool or not isinstance(value, bool)),
                 f"{name} must be {what}, got {value!r}")
        for f in ("vocab_size", "n_layers", "d_model", "n_heads", "head_dim", "ffn_dim",
                  "original_max_len", "prefill_chunk"):
            need(int(getattr(self, f)) > 0, f"{f} must be positive, got {getattr(self, f)}")
        need(self.head_dim % 2 == 0, f"head_dim must be even for RoPE, got {self.head_dim}")
        need(self.n_heads * self.head_dim == self.d_model,
             f"n_heads * head_dim = {self.n_heads * self.head_dim} must equal d_model = {self.d_model}")
        need(self.rope_theta > 0, f"rope_theta must be positive, got {self.rope_theta}")
        kv = self.kv_heads
        need(kv > 0 and self.n_heads % kv == 0,
             f"n_kv_heads ({kv}) must be positive and divide n_heads ({self.n_heads})")
        if self.arch != "anchormass":
            return
        need(self.n_local_heads >= 0 and self.n_global_heads >= 1,
             f"need n_local_heads >= 0 and n_global_heads >= 1, got {self.n_local_heads}/{self.n_global_heads}")
        need(self.n_local_heads + self.n_global_heads == self.n_heads,
             f"n_local_heads + n_global_heads = {self.n_local_heads + self.n_global_heads} "
             f"must equal n_heads = {self.n_heads}")
        g = self.q_per_kv
        need(self.n_local_heads % g == 0,
             f"n_local_heads ({self.n_local_heads}) must be a multiple of n_heads / n_kv_heads = {g}: "
             f"local and global heads are whole KV groups")
        need(self.window >= 1, f"window must be >= 1, got {self.window}")
        need(self.group_size >= 1, f"group_size must be >= 1, got {self.group_size}")
        need(self.block_size >= self.group_size and self.block_size % self.group_size == 0,
             f"block_size ({self.block_size}) must be a multiple of group_size ({self.group_size})")
        need(self.n_sinks >= 0, f"n_sinks must be >= 0, got {self.n_sinks}")
        need(self.slot_budget >= 4, f"slot_budget must be >= 4, got {self.slot_budget}")
        try:
            check_protect_fraction(self.protect_fraction)
        except ConfigError as err:
            need(False, str(err))

    # ------------------------------------------------------------- derived
    @property
    def kv_heads(self) -> int:
        """Key/value heads: n_kv_heads, or n_heads when it is null."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def q_per_kv(self) -> int:
        """Query heads sharing one KV head (1 without GQA); query head h reads KV head h // q_per_kv."""
        return self.n_heads // self.kv_heads

    @property
    def n_local_kv_heads(self) -> int:
        return self.n_local_heads // self.q_per_kv

    @property
    def n_global_kv_heads(self) -> int:
        return self.n_global_heads // self.q_per_kv

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
        for name, before in FIELDS_ADDED_LATER.items():  # a config saved before the field existed
            data.setdefault(name, before)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"model config: unknown field(s) {unknown}; known fields are {sorted(known)}")
        missing = [f.name for f in fields(cls) if f.name not in data]
        if missing:
            raise ConfigError(f"model config: missing field(s) {missing} (a preset gets them from "
                              f"configs/model/{BASE_PRESET}.yaml)")
        return cls(**data)

    def replace(self, **changes: Any) -> "ModelConfig":
        return self.from_dict({**self.to_dict(), **changes})


# Fields added after checkpoints were written, with the value that gives the model they describe:
# an older checkpoint's `model_config` lacks them and loads as that model.
# The fields that shape a model's tensors: two configs that agree on them hold tensors of the same
# shapes (arch, the local/global split and the outlier scorer choice aside). Checked where one model
# starts from, learns from or is scored against another's weights.
TENSOR_FIELDS = ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim", "ffn_dim", "vocab_size",
                 "tie_embeddings")

FIELDS_ADDED_LATER = {"n_kv_heads": None, "tie_embeddings": False, "outlier_scorer": "rule"}


@functools.cache
def _field_types() -> dict[str, Any]:
    """Field name -> resolved annotation (a Python type or a Literal)."""
    return typing.get_type_hints(ModelConfig)


def available_presets() -> list[str]:
    return group_names(CONFIG_DIR)


def read_preset(spec: "str | Path") -> dict[str, Any]:
    """The fields of a preset (a name in configs/model/ or a YAML path) with its `defaults` list
    applied, as Hydra composes the `model` group (anchormass/config_compose.py)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_container(compose_file(spec, CONFIG_DIR, "model"), resolve=True)


def load_model_config(spec: "str | Path | Mapping[str, Any] | ModelConfig") -> ModelConfig:
    """A preset name (`configs/model/<name>.yaml`), a YAML path, a complete mapping (a checkpoint's
    `model_config`, a composed Hydra `model` node) or a ModelConfig."""
    if isinstance(spec, ModelConfig):
        return spec
    if isinstance(spec, Mapping):
        return ModelConfig.from_dict(spec)
    from omegaconf import DictConfig, OmegaConf

    if isinstance(spec, DictConfig):
        return ModelConfig.from_dict(OmegaConf.to_container(spec, resolve=True))
    return ModelConfig.from_dict(read_preset(spec))
