"""Shared behaviour of the command-line entry points: one-line errors, non-zero exit."""

import functools
import sys

from omegaconf import OmegaConf

from anchormass.errors import AnchorMassError

# `${min:a,b}` in configs (the Optuna search space caps warmup at a shortened stage's length:
# configs/hydra/sweeper/optuna_optim.yaml). Registered on import: every entry point imports this.
if not OmegaConf.has_resolver("min"):
    OmegaConf.register_new_resolver("min", lambda *values: min(values))


def exit_on_error(fn):
    """Run `fn`; an `AnchorMassError` becomes `error: <message>` on stderr and exit code 2, as does
    a config value that cannot be resolved (`${oc.env:UNSET}/data`: a traceback of ~95 lines before)."""
    from omegaconf.errors import InterpolationResolutionError

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except AnchorMassError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)
        except InterpolationResolutionError as err:
            print(f"error: {unresolved_text(err)}", file=sys.stderr)
            sys.exit(2)

    return wrapper


def key_value_options(argv: list[str], defaults: dict) -> dict:
    """A script's key=value options over its `defaults`; any other argument is one error line."""
    from anchormass.errors import ConfigError

    opts = dict(defaults)
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in defaults:
            raise ConfigError(f"expected key=value with a key in {sorted(defaults)}, got {arg!r}")
        opts[key] = value
    return opts


def unresolved_text(err: Exception) -> str:
    """One line for a config value OmegaConf could not resolve: the key, and an unset environment
    variable by name."""
    import re

    key = getattr(err, "full_key", None) or "a config value"
    unset = re.search(r"Environment variable '([^']*)' not found", str(err))
    if unset:
        name = unset.group(1)
        return (f"{key}: environment variable {name} is not set (the config reads it with ${{oc.env:{name}}}); "
                f"set it, or give {key} without it")
    first = (str(getattr(err, "msg", "")) or str(err)).strip().splitlines()
    return f"{key}: cannot resolve its value ({first[0] if first else type(err).__name__})"


def quoted_where_needed(argv: list[str]) -> list[str]:
    """`key=value` overrides that Hydra's grammar cannot read unquoted (a path with non-ASCII
    characters: `out_dir=/data/出力`) as `key="value"`, which it reads as the same string; every
    other argument as given. A path the user typed is then a path, not a lexer error."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()

    def parses(text: str) -> bool:
        try:
            parser.parse_override(text)
        except Exception:
            return False
        return True

    out = []
    for arg in argv:
        key, eq, value = arg.partition("=")
        if (not arg.startswith("-") and eq and value and not any(c in value for c in "\"'")
                and not parses(arg) and parses(f'{key}="{value}"')):
            arg = f'{key}="{value}"'
        out.append(arg)
    return out


def check_override_path(path, what: str) -> None:
    """Refuse a path that a command line of `key=value` overrides cannot carry as one string (as
    quoted_where_needed passes it): Hydra reads `runs,old` as two values and `a=b`, `[`, `'` as its
    own syntax, so every stage given such a folder would be refused, or run somewhere else."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from anchormass.errors import ConfigError

    text = str(path)
    (arg,) = quoted_where_needed([f"path={text}"])
    try:
        override = OverridesParser.create().parse_override(arg)
        same = not override.is_sweep_override() and override.value() == text
    except Exception:
        same = False
    if not same:
        raise ConfigError(f"{what} {text!r} cannot be passed on as one path: Hydra's override grammar reads "
                          f"',' in it as a list of values (and = [ ] {{ }} ( ) ' \" as its own syntax); "
                          f"choose a folder name without them")


@exit_on_error
def check_group_choices(config_dir, argv: list[str]) -> None:
    """Refuse `group=option` overrides naming a config file that does not exist, in one line.

    Hydra reports these itself, but over several lines and with exit code 1, before any of our
    code runs; checking argv first keeps every entry point's bad-input contract (one line, exit 2).
    Sweeps (`model=a,b`) are checked option by option; anything that is not a plain group
    choice (dotted keys, lists, interpolations) is left to Hydra. Folders added with
    `hydra.searchpath=[file://...]` are searched too; other search-path kinds are Hydra's to check.
    """
    from pathlib import Path

    from anchormass.errors import ConfigError

    roots = [Path(config_dir)]
    for arg in argv:
        if arg.startswith("hydra.searchpath="):
            for entry in filter(None, arg.split("=", 1)[1].strip("[]").split(",")):
                if not entry.strip().startswith("file://"):
                    return
                roots.append(Path(entry.strip().removeprefix("file://")))
    for arg in argv:
        key, eq, value = arg.lstrip("+").partition("=")
        groups = [root / key for root in roots if (root / key).is_dir()]
        if not eq or "." in key or "/" in key or not groups:
            continue
        if any(c in value for c in "[]${}()/") or value.endswith(".yaml") or value in ("", "null"):
            continue
        for option in value.split(","):
            if not any((group / f"{option}.yaml").is_file() for group in groups):
                known = ", ".join(sorted({p.stem for group in groups for p in group.glob("*.yaml")}))
                raise ConfigError(f"unknown {key} '{option}'; choose one of: {known}")
    from anchormass.extras import check_choices

    check_choices(argv)  # a known choice whose plugin or library is not installed


def composed_variants(argv: list[str]) -> list[list[str]]:
    """The override lists a run (or every job of a `-m` sweep) composes: a choice sweep
    (`optim.lr=1e-3,fast`) contributes each of its values once; range / interval sweeps
    (Optuna's search space) are numbers Hydra draws itself and are left out."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    plain = [a for a in argv if not a.startswith("-")]
    parsed = OverridesParser.create().parse_overrides(plain)
    base, sweeps = [], []
    for text, override in zip(plain, parsed):
        if not override.is_sweep_override():
            base.append(text)
            continue
        key = text.split("=", 1)[0]
        try:
            values = list(override.sweep_string_iterator())
        except Exception:  # interval(...) / tag(...): not enumerable
            continue
        sweeps.append([f"{key}={value}" for value in values])
    first = [values[0] for values in sweeps]
    variants = [[*base, *first]]
    for i, values in enumerate(sweeps):
        for value in values[1:]:
            variants.append([*base, *first[:i], value, *first[i + 1:]])
    return variants


@exit_on_error
def check_overrides(config_dir, config_name: str, argv: list[str], check=None) -> list:
    """Compose the config the way Hydra will, before Hydra creates any folder or log, and turn
    what it would report over several lines (exit 1) into one line (exit 2): an unknown key
    (`stage.totl_steps=5`), an unknown choice in one of Hydra's own groups
    (`hydra/launcher=submitit_locl`). `check(cfg)` then runs the entry point's typed checks on
    every composed variant, so `stage.val_every=0` is refused before a run folder exists.
    Returns the composed variants (with their `hydra` node; one for a plain run, none when a
    Hydra flag such as --cfg asks for something else), so no caller composes them again."""
    import difflib

    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf import OmegaConf

    from anchormass.errors import ConfigError

    if any(a.startswith("-") and a not in ("-m", "--multirun") for a in argv):
        return []  # Hydra's own flags (--cfg job, --config-name x, --help): another config, or nothing runs
    try:
        variants = composed_variants(argv)
    except OverrideParseException as err:
        raise ConfigError(f"cannot read the overrides: {str(err).splitlines()[0]}") from None
    if len(variants) > 1 and not any(a in ("-m", "--multirun") for a in argv):
        sweep = next(a for a in argv if a not in variants[0])
        raise ConfigError(f"{sweep} lists several values: add -m to sweep over them, or write one value")
    composed = []
    for overrides in variants:
        try:
            with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
                cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
        except MissingConfigException as err:
            group, _, option = str(err.missing_cfg_file or "").rpartition("/")
            if not group or not err.options:
                raise ConfigError(str(err).splitlines()[0]) from None
            raise ConfigError(f"unknown {group} '{option}'; choose one of: {', '.join(sorted(err.options))}") from None
        except ConfigCompositionException as err:
            key = getattr(err.__cause__, "full_key", None)
            if not key:
                raise ConfigError(str(err).splitlines()[0]) from None
            parent, _, leaf = key.rpartition(".")
            known = cfg_without(config_dir, config_name, overrides, key)
            node = (OmegaConf.select(known, parent) if parent else known) if known is not None else None
            near = difflib.get_close_matches(leaf, [k for k in node.keys() if k != "hydra"]
                                             if hasattr(node, "keys") else [], n=1)
            hint = f"did you mean {parent + '.' if parent else ''}{near[0]}? " if near else ""
            written = next((o.split("=", 1)[0] for o in overrides if o.split("=", 1)[0] == key
                            or o.split("=", 1)[0].startswith(key + ".")), key)
            raise ConfigError(f"unknown key {written}; {hint}a new key needs a leading +: +{written}=...") from None
        if check is not None:
            check(cfg)
        composed.append(cfg)
    return composed


def cfg_without(config_dir, config_name: str, overrides: list[str], key: str):
    """The config composed without the override of `key` (to suggest the key that was meant)."""
    from hydra import compose, initialize_config_dir

    def names_key(override: str) -> bool:
        name = override.lstrip("+~").split("=", 1)[0]
        return name == key or name.startswith(key + ".")

    rest = [o for o in overrides if not names_key(o)]
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            return compose(config_name, overrides=rest)
    except Exception:
        return None
