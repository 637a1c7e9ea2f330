"""The recipe: a curriculum file (configs/curriculum/<name>.yaml) as a typed, checked spec.

A recipe lists models, stages and closing evaluations (docs/method.md §5). Stages and evaluations
are mappings keyed by name, so a recipe composes as Hydra composes any config: a study writes
`defaults: [mini, _self_]` and states only what it changes; Hydra merges the mappings key by key
(a key set to null is removed). Within one file, `like: <stage>` starts a stage from another
stage's entry (the long-context stages of the 158M recipe differ only in their length).

Stage entry (key = its name, its folder, and what `init_from`, `evaluate` and a model's `stages`
refer to): `stage` (the configs/stage preset, default the key), `data` (configs/data/<name>),
`data_set` ({<data key>: value}; a stage that sets any gets a dataset of its own,
`data/<curriculum>_<stage>`, unless it names one), `init_from` (an earlier stage whose last checkpoint seeds it, a
checkpoint file, or null), `shared` (trained once by the first model; anchormass/curriculum/plan.py), `set`
({<stage key>: value}).

Model entry: a preset name, or a variant `{name, model, overrides, stages, seeds, init_from,
stage_overrides}`: an ablation of one preset, which may train only some stages and some of the
recipe's seeds. `init_from: {<stage>: <model>/<stage>}` starts one of its stages from another model's
stage (a retrofit: AnchorMass from a trained Standard, docs/method.md §6 j); `stage_overrides:
{<stage>: [...]}` adds train.py overrides to one stage only (a compression schedule raising
model.group_size stage by stage). A stage's own `init_from` may name another model's stage the same way.
Either `init_from` may also be a checkpoint file that no stage trains (a value ending in `.ckpt`, relative
to the folder the command runs in like runs_root and data/: `{retro_1k: imports/smollm2/model.ckpt}`, a
model imported by scripts/import_hf.py); curriculum/start_files.py says how such a start is checked.

Evaluate entry (key = its name, its report folder): `stage`, `overrides` (evaluate.py), and the
models it compares: `pair: [a, b]` (either may be `<model>/<stage>`: that model's run of another
stage, e.g. a retrofitted model against the Standard it started from), or `against: <model>` (one
comparison of that model with every other model, each named after the other model: the ablations),
else the first two models.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from anchormass.errors import ConfigError
from anchormass.path_checks import check_recipe_names
from anchormass.utils import CHECKOUT

STAGE_KEYS = {"stage", "data", "data_set", "init_from", "shared", "set", "like"}
MODEL_KEYS = {"name", "model", "overrides", "stages", "seeds", "init_from", "stage_overrides"}
EVAL_KEYS = {"stage", "pair", "against", "overrides"}
START_FILE_SUFFIX = ".ckpt"  # an init_from value ending so is a checkpoint file, not a stage


def is_start_file(start: str | None) -> bool:
    """Whether an `init_from` value names a checkpoint file rather than a (model's) stage."""
    return isinstance(start, str) and start.endswith(START_FILE_SUFFIX)


@dataclass(frozen=True)
class ModelSpec:
    name: str  # the label in folders and tables
    preset: str  # configs/model/<preset>
    overrides: tuple[str, ...] = ()  # train.py overrides for every stage of this model
    stages: tuple[str, ...] | None = None  # the stage keys it trains (None: all)
    seeds: tuple[int, ...] | None = None  # the recipe seeds it trains under (None: all)
    init_from: tuple[tuple[str, str], ...] = ()  # (stage, "<model>/<stage>" or a .ckpt file): its own start
    stage_overrides: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (stage, train.py overrides for it alone)

    def start_of(self, entry: "StageSpec") -> str | None:
        """The run a stage starts from: this model's own choice for it, else the stage's."""
        return dict(self.init_from).get(entry.key, entry.init_from)

    def overrides_for(self, stage: str) -> tuple[str, ...]:
        return (*self.overrides, *dict(self.stage_overrides).get(stage, ()))

    def trains(self, stage: str, seed: int | None) -> bool:
        return ((self.stages is None or stage in self.stages)
                and (self.seeds is None or seed is None or seed in self.seeds))


@dataclass(frozen=True)
class StageSpec:
    key: str
    preset: str  # configs/stage/<preset>
    data: str  # configs/data/<data>
    data_set: tuple[tuple[str, Any], ...] = ()  # (data key, value), with the dataset's name and folder
    init_from: str | None = None
    shared: bool = False
    settings: tuple[tuple[str, Any], ...] = ()  # (stage key, value)

    @property
    def seq_len(self) -> int | None:
        return dict(self.settings).get("seq_len")


@dataclass(frozen=True)
class EvalSpec:
    name: str
    stage: str
    a: str  # the model labels compared: A (ckpt=) and B (compare_ckpt=)
    b: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Recipe:
    name: str
    models: tuple[ModelSpec, ...]
    stages: tuple[StageSpec, ...]
    evaluate: tuple[EvalSpec, ...]
    seeds: tuple[int, ...] | None = None  # None: one run per model, the train config's own seed
    parallel: int = 1  # chains that train side by side
    trainer: str = "cpu"
    overrides: tuple[str, ...] = ()  # train.py overrides for every stage
    eval_overrides: tuple[str, ...] = ()  # appended to every evaluate entry's overrides
    report_note: str | None = None  # the first line of the closing report

    @property
    def seed_list(self) -> list[int | None]:
        return list(self.seeds) if self.seeds is not None else [None]


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value


def _loose(entry: DictConfig) -> DictConfig:
    """The entry without its `name` (the key says it), as a copy free of the composed config's struct
    flag, so entries can be merged and extended."""
    return OmegaConf.create({k: v for k, v in OmegaConf.to_container(entry, resolve=True).items() if k != "name"})


def _keyed(cfg: DictConfig, field: str, key_of) -> dict[str, DictConfig]:
    """A mapping field (key -> entry; null entries removed) or a list of entries keyed by `key_of`;
    either way the entries come without their `name` key."""
    raw = cfg.get(field)
    if raw is None:
        return {}
    if isinstance(raw, DictConfig):
        out = {}
        for key, entry in raw.items():
            if entry is None:
                continue  # removed by a composing recipe
            if not isinstance(entry, DictConfig):
                raise ConfigError(f"curriculum {cfg.name}: {field}.{key} must be a mapping, got {entry!r}")
            out[str(key)] = _loose(entry)
        return out
    out = {}
    for entry in raw:
        if not isinstance(entry, DictConfig):
            raise ConfigError(f"curriculum {cfg.name}: every {field} entry must be a mapping, got {entry!r}")
        key = key_of(entry)
        if key in out:
            raise ConfigError(f"curriculum {cfg.name}: {field} names must be unique (give a repeated preset a "
                              f"`name`), {key} repeats")
        out[key] = _loose(entry)
    return out


def _resolve_like(name: str, entries: dict[str, DictConfig]) -> dict[str, DictConfig]:
    """Each `like: <other>` entry as the other (itself resolved) with its own keys merged on top."""
    done: dict[str, DictConfig] = {}

    def resolve(key: str, trail: tuple[str, ...]) -> DictConfig:
        if key in done:
            return done[key]
        entry = entries[key]
        base = entry.get("like")
        if base is not None:
            if base not in entries or base in trail:
                raise ConfigError(f"curriculum {name}: stage {key} is like '{base}', which is "
                                  + ("itself" if base in trail else f"not one of its stages {list(entries)}"))
            own = OmegaConf.masked_copy(entry, [k for k in entry if k != "like"])
            entry = OmegaConf.merge(resolve(base, (*trail, key)), own)
            # what follows a stage is the stage's own choice, never inherited
            entry.init_from = own.get("init_from")
        done[key] = entry
        return entry

    return {key: resolve(key, (key,)) for key in entries}


def _stage(name: str, key: str, e: DictConfig) -> StageSpec:
    unknown = set(e.keys()) - STAGE_KEYS
    if unknown:
        raise ConfigError(f"curriculum {name}: stage {key} has unknown keys {sorted(unknown)} "
                          f"(a stage takes {sorted(STAGE_KEYS)})")
    if not e.get("data"):
        raise ConfigError(f"curriculum {name}: stage {key} needs 'data' (a configs/data name)")
    data_set = dict(_plain(e.get("data_set")) or {})
    if data_set and not {"name", "out_dir"} & set(data_set):  # changed data: a dataset of its own
        data_set = {"name": f"{name}_{key}", "out_dir": f"data/{name}_{key}", **data_set}
    return StageSpec(key=key, preset=str(e.get("stage") or key), data=str(e.data),
                     data_set=tuple(data_set.items()), init_from=e.get("init_from"),
                     shared=bool(e.get("shared", False)), settings=tuple((dict(_plain(e.get("set")) or {})).items()))


def _seeds(cfg: DictConfig) -> tuple[int, ...] | None:
    value = cfg.get("seeds")
    if value is None:
        return None
    items = list(value) if not isinstance(value, (str, int)) else None
    if not items or any(isinstance(x, bool) or not isinstance(x, int) for x in items) or len(set(items)) < len(items):
        raise ConfigError(f"curriculum.seeds must be a non-empty list of distinct integers, got {value!r}")
    return tuple(items)


def _per_stage(name: str, m: DictConfig, key: str, trained: set[str]) -> dict[str, Any]:
    """A model entry's {<stage>: value} mapping, checked to name only stages the model trains."""
    value = _plain(m.get(key)) or {}
    if not isinstance(value, dict) or set(value) - trained:
        raise ConfigError(f"curriculum {name}: model {m.name}: {key} must map stages it trains "
                          f"{sorted(trained)} to values, got {value!r}")
    return value


def _models(cfg: DictConfig, keys: list[str], seeds: tuple[int, ...] | None) -> tuple[ModelSpec, ...]:
    specs = []
    for m in cfg.models:
        if isinstance(m, str):
            specs.append(ModelSpec(m, m))
            continue
        if not isinstance(m, DictConfig) or not isinstance(m.get("name"), str) or not isinstance(m.get("model"), str):
            raise ConfigError(f"curriculum {cfg.name}: a models entry is a preset name or "
                              f"{{name: <label>, model: <preset>, overrides: [...]}}, got {m!r}")
        extra = set(m.keys()) - MODEL_KEYS
        if extra:
            raise ConfigError(f"curriculum {cfg.name}: model {m.name} has unknown keys {sorted(extra)}")
        own_stages = None if m.get("stages") is None else tuple(str(x) for x in m.stages)
        own_seeds = None if m.get("seeds") is None else tuple(m.seeds)
        if own_stages is not None and (not own_stages or set(own_stages) - set(keys)):
            raise ConfigError(f"curriculum {cfg.name}: model {m.name}: stages must be a non-empty list of "
                              f"{keys}, got {list(own_stages)}")
        if own_seeds is not None and (seeds is None or not own_seeds or set(own_seeds) - set(seeds)):
            raise ConfigError(f"curriculum {cfg.name}: model {m.name}: seeds must be a non-empty subset of "
                              f"curriculum.seeds {list(seeds) if seeds else None}, got {list(own_seeds)}")
        trained = set(own_stages if own_stages is not None else keys)
        starts = _per_stage(cfg.name, m, "init_from", trained)
        if any(not isinstance(v, str) for v in starts.values()):
            raise ConfigError(f"curriculum {cfg.name}: model {m.name}: init_from maps a stage to "
                              f"'<model>/<stage>' or a checkpoint file '<path>{START_FILE_SUFFIX}', got {starts}")
        per_stage = _per_stage(cfg.name, m, "stage_overrides", trained)
        if any(not isinstance(v, list) for v in per_stage.values()):
            raise ConfigError(f"curriculum {cfg.name}: model {m.name}: stage_overrides maps a stage to a list of "
                              f"overrides, got {per_stage}")
        specs.append(ModelSpec(m.name, m.model, tuple(str(o) for o in (m.get("overrides") or [])),
                               own_stages, own_seeds, tuple(starts.items()),
                               tuple((k, tuple(str(o) for o in v)) for k, v in per_stage.items())))
    labels = [s.name for s in specs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ConfigError(f"curriculum {cfg.name}: model labels must be unique, {', '.join(dup)} repeats")
    return _only(cfg, specs)


def _only(cfg: DictConfig, specs: list[ModelSpec]) -> tuple[ModelSpec, ...]:
    """`curriculum.only=[names]`: the named models of the recipe, as it defines them, in its order."""
    only = _plain(cfg.get("only"))
    if only is None:
        return tuple(specs)
    names = [only] if isinstance(only, str) else list(only)
    labels = [s.name for s in specs]
    if not names or set(names) - set(labels):
        raise ConfigError(f"curriculum {cfg.name}: curriculum.only names models of the recipe; "
                          f"{sorted(set(names) - set(labels)) or '[]'} is not among {labels}")
    return tuple(s for s in specs if s.name in names)


def _evaluations(cfg: DictConfig, labels: list[str], stages: list[str]) -> tuple[EvalSpec, ...]:
    """Each evaluate entry with the labels it compares. Checked before any training, so a typo does
    not surface after hours of it."""
    out = []
    for name, entry in _keyed(cfg, "evaluate", lambda e: str(e.get("name"))).items():
        unknown = set(entry.keys()) - EVAL_KEYS
        if name == "None" or entry.get("stage") not in stages or unknown:
            raise ConfigError(f"curriculum {cfg.name}: an evaluate entry needs a name and one of the stages "
                              f"{stages}" + (f" (unknown keys {sorted(unknown)})" if unknown else "")
                              + f", got {name}: {dict(entry)}")
        overrides = tuple(str(o) for o in entry.get("overrides") or [])
        if entry.get("against") is not None:
            base = str(entry.against)
            if base not in labels:
                raise ConfigError(f"curriculum {cfg.name}: evaluate {name}: against must be one of {labels}, "
                                  f"got {base}")
            out += [EvalSpec(other, str(entry.stage), base, other, overrides) for other in labels if other != base]
            continue
        pair = entry.get("pair")
        if pair is None:
            if len(labels) < 2:
                raise ConfigError("the closing comparison needs two models, got "
                                  f"curriculum.models=[{','.join(labels)}]; "
                                  f"pass two models or evaluate=false")
            pair = labels[:2]
        pair = [str(p) for p in pair] if not isinstance(pair, str) else [pair]
        if (len(pair) != 2 or pair[0] == pair[1] or any(p.split("/", 1)[0] not in labels for p in pair)
                or any(p.split("/", 1)[1] not in stages for p in pair if "/" in p)):
            raise ConfigError(f"curriculum {cfg.name}: evaluate {name}: pair must name two different "
                              f"models of {labels} (or <model>/<stage> of its stages), got {pair}")
        out.append(EvalSpec(name, str(entry.stage), pair[0], pair[1], overrides))
    return tuple(out)


def _report_note(cfg: DictConfig) -> str | None:
    """The closing report's first line: `report_note` (text), else the text of `report_note_file`, a
    file of the checkout (a study's finding is kept with its results under docs/results/, not in the
    recipe). Without a checkout (an installed copy ships configs, not docs) that note is left out."""
    if cfg.get("report_note") is not None:
        return str(cfg.report_note)
    name = cfg.get("report_note_file")
    if name is None:
        return None
    path = Path(str(name))
    if not path.is_absolute():
        if CHECKOUT is None:
            return None
        path = CHECKOUT / path
    if not path.is_file():
        raise ConfigError(f"curriculum {cfg.get('name')}: report_note_file {name} is not a file")
    return path.read_text(encoding="utf-8")


def load_recipe(cfg: DictConfig, with_evaluate: bool = True) -> Recipe:
    """The composed `curriculum` node as a checked Recipe (one-line ConfigErrors). Without
    `with_evaluate` the evaluate entries are left out unchecked (a run with evaluate=false)."""
    for key in ("name", "models", "stages"):
        if cfg.get(key) is None:
            raise ConfigError(f"the curriculum lacks '{key}'")
    check_recipe_names(cfg)  # its names become folders under runs_root: none may point outside it
    parallel = cfg.get("parallel", 1)
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        raise ConfigError(f"curriculum.parallel must be a whole number of models >= 1, got {parallel!r}")
    entries = _resolve_like(str(cfg.name), _keyed(cfg, "stages", lambda e: str(e.get("name") or e.get("stage"))))
    stages = tuple(_stage(str(cfg.name), key, e) for key, e in entries.items())
    seeds = _seeds(cfg)
    models = _models(cfg, [s.key for s in stages], seeds)
    evaluate = _evaluations(cfg, [m.name for m in models], [s.key for s in stages]) if with_evaluate else ()
    return Recipe(name=str(cfg.name), models=models, stages=stages, evaluate=evaluate, seeds=seeds,
                  parallel=parallel, trainer=str(cfg.get("trainer", "cpu")),
                  overrides=tuple(str(o) for o in cfg.get("overrides") or []),
                  eval_overrides=tuple(str(o) for o in cfg.get("eval_overrides") or []),
                  report_note=_report_note(cfg))
