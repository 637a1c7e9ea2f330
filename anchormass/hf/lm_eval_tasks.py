"""lm-evaluation-harness task configs built from the harness's own definitions.

`jcqa_local`: the harness's `ja_leaderboard_jcommonsenseqa` (read from the installed lm_eval
package, so description, prompt layout, choice handling, target delimiter and 3-shot sampling
are the harness's) with its data taken from local JGLUE v1.3 JSON-lines files instead of the
hub, and `acc_norm` scored beside `acc` (the leaderboard lists only acc).
"""

from __future__ import annotations

from pathlib import Path

from anchormass.cli import exit_on_error
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


@exit_on_error
def main(argv: list[str]) -> None:
    """python -m anchormass.hf.lm_eval_tasks <JGLUE JCommonsenseQA folder> <include folder>"""
    if len(argv) != 2:
        raise ConfigError("usage: python -m anchormass.hf.lm_eval_tasks <folder with valid-v1.3.json and "
                          "train-v1.3.json> <include folder to write>")
    out = write_include_dir(argv[1], argv[0])
    print(f"lm_eval --include_path {out} --tasks jcqa_local --model hf --model_args pretrained=<exported folder>")


def task_specs(names: list[str], jglue_dir: str | Path | None) -> list:
    """Harness task specs: our local tasks as config dicts, any other name passed through."""
    return [jcqa_local_config(jglue_dir) if n == "jcqa_local" else n for n in names]


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
