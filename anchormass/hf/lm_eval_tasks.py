"""lm-evaluation-harness task configs built from the harness's own definitions.

`jcqa_local`: the harness's `ja_leaderboard_jcommonsenseqa` (read from the installed lm_eval
package, so description, prompt layout, choice handling, target delimiter and 3-shot sampling
are the harness's) with its data taken from local JGLUE v1.3 JSON-lines files instead of the
hub, and `acc_norm` scored beside `acc` (the leaderboard lists only acc).
"""

from __future__ import annotations

from pathlib import Path

from anchormass.cli import exit_on_error
from anchormass.command_names import command
from anchormass.errors import ConfigError, DataError
from anchormass.utils import atomic_write_text

HARNESS_JCQA = ("japanese_leaderboard", "ja_leaderboard_jcommonsenseqa.yaml")
JCQA_FILES = {"train": "train-v1.3.json", "validation": "valid-v1.3.json"}
LOCAL_TASKS = ("jcqa_local",)


def jcqa_files(jglue_dir: str | Path | None) -> dict[str, Path]:
    """{split: path} of the JCommonsenseQA v1.3 files in `jglue_dir` (checked to exist)."""
    if not jglue_dir:
        raise ConfigError("task jcqa_local needs the JGLUE JCommonsenseQA folder: eval.lm_eval.jcqa_dir=<dir with "
                          "valid-v1.3.json and train-v1.3.json>")
    files = {split: Path(str(jglue_dir)).expanduser() / name for split, name in JCQA_FILES.items()}
    for path in files.values():
        if not path.is_file():
            raise DataError(f"JCommonsenseQA file not found: {path}")
    return files


def harness_jcqa_yaml() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent.joinpath(*HARNESS_JCQA)


def jcqa_local_changes(jglue_dir: str | Path) -> dict:
    """What jcqa_local changes in the harness's task: its name, local data, acc_norm beside acc."""
    return {"task": "jcqa_local", "dataset_path": "json", "dataset_name": None,
            "dataset_kwargs": {"data_files": {split: str(p.resolve()) for split, p in jcqa_files(jglue_dir).items()}},
            "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True}
                            for m in ("acc", "acc_norm")]}


def jcqa_local_config(jglue_dir: str | Path) -> dict:
    """The harness task config for JCommonsenseQA read from `jglue_dir` (what suite=lm_eval runs)."""
    from lm_eval.tasks._yaml_loader import load_yaml

    cfg = load_yaml(harness_jcqa_yaml(), resolve_func=True)
    cfg.pop("tag", None)  # not part of the leaderboard group when run from here
    cfg.update(jcqa_local_changes(jglue_dir))
    return cfg


def write_include_dir(out_dir: str | Path, jglue_dir: str | Path) -> Path:
    """A folder for `lm_eval --include_path <out_dir> --tasks jcqa_local`: one YAML that includes
    the installed harness's own task file (so prompt, few-shot split and process_docs are the
    harness's, exactly as in jcqa_local_config) with the same changes. The data paths are
    absolute, so the command works from any folder, offline."""
    import yaml

    out = Path(out_dir)
    text = yaml.safe_dump({"include": str(harness_jcqa_yaml()), **jcqa_local_changes(jglue_dir)},
                          allow_unicode=True, sort_keys=False)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "jcqa_local.yaml", "# written by python -m anchormass.hf.lm_eval_tasks\n" + text)
    return out


# The harness's own context limit when a model states none; what suite=lm_eval gives our model.
HARNESS_MAX_LENGTH = 2048


def harness_model_args(export_dir: str | Path) -> tuple[str, str | None]:
    """`--model_args` for an exported folder, and why the folder needs more than `pretrained=`.

    AnchorMass: its code lives in this package (`trust_remote_code=True`). Llama: the harness
    takes `max_position_embeddings` (the trained length, e.g. 256) as its context limit and cuts
    each 3-shot prompt from the left to fit; `max_length` at the harness's default, past the
    trained length, scores the whole prompt as suite=lm_eval does (README, "Use with Hugging Face")."""
    import json

    folder = Path(export_dir).expanduser().resolve()
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise DataError(f"{folder} is not an exported model folder (no readable config.json); "
                        f"export one with {command('scripts/export_hf.py')}") from None
    if config.get("model_type") == "llama":
        trained = int(config.get("max_position_embeddings") or 0)
        length = max(HARNESS_MAX_LENGTH, trained)
        why = (f"max_length={length}: the folder's max_position_embeddings ({trained}, the trained length) would "
               f"make the harness cut each prompt to it; past it the Llama folder's plain RoPE is not our dynamic "
               f"NTK, so scores there differ from the checkpoint's (README)")
        return f"pretrained={folder},max_length={length}", why
    if config.get("auto_map"):
        return f"pretrained={folder},trust_remote_code=True", "trust_remote_code=True: the model's code is this package"
    return f"pretrained={folder}", None


def harness_command(include_dir: str | Path, export_dir: str | Path) -> tuple[list[str], str | None]:
    """The lm_eval command line (as a list) that runs jcqa_local on `export_dir`, and its note."""
    model_args, why = harness_model_args(export_dir)
    return (["lm_eval", "--model", "hf", "--model_args", model_args, "--include_path",
             str(Path(include_dir).resolve()), "--tasks", "jcqa_local", "--batch_size", "1"], why)


@exit_on_error
def main(argv: list[str]) -> None:
    """python -m anchormass.hf.lm_eval_tasks <JGLUE JCommonsenseQA folder> <include folder> <exported folder>

    Writes the include folder and prints the harness command for the exported folder, ready to
    run (paths quoted for the shell); the note on its model arguments goes to stderr."""
    import shlex
    import sys

    if len(argv) != 3:
        raise ConfigError("usage: python -m anchormass.hf.lm_eval_tasks <folder with valid-v1.3.json and "
                          "train-v1.3.json> <include folder to write> <exported model folder>")
    harness_model_args(argv[2])  # an unreadable export is refused before anything is written
    out = write_include_dir(argv[1], argv[0])
    command, why = harness_command(out, argv[2])
    if why:
        print(f"note: {why}", file=sys.stderr)
    # batch_size 1: the harness pads a batch without a mask (README, "Use with Hugging Face")
    print(shlex.join(command))


def task_specs(names: list[str], jglue_dir: str | Path | None) -> list:
    """Harness task specs: our local tasks as config dicts, any other name passed through."""
    return [jcqa_local_config(jglue_dir) if n == "jcqa_local" else n for n in names]


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
