"""lm-evaluation-harness task configs built from the harness's own definitions.

`jcqa_local`: the harness's `ja_leaderboard_jcommonsenseqa` (read from the installed lm_eval
package, so description, prompt layout, choice handling, target delimiter and 3-shot sampling
are the harness's) with its data taken from local JGLUE v1.3 JSON-lines files instead of the
hub, and `acc_norm` scored beside `acc` (the leaderboard lists only acc).
"""

from __future__ import annotations

from pathlib import Path

from anchormass.errors import ConfigError, DataError

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


def jcqa_local_config(jglue_dir: str | Path) -> dict:
    """The harness task config for JCommonsenseQA read from `jglue_dir`."""
    import lm_eval.tasks
    from lm_eval.tasks._yaml_loader import load_yaml

    cfg = load_yaml(Path(lm_eval.tasks.__file__).parent.joinpath(*HARNESS_JCQA), resolve_func=True)
    cfg.pop("tag", None)  # not part of the leaderboard group when run from here
    cfg.update(task="jcqa_local", dataset_path="json", dataset_name=None,
               dataset_kwargs={"data_files": {split: str(p) for split, p in jcqa_files(jglue_dir).items()}},
               metric_list=[{"metric": m, "aggregation": "mean", "higher_is_better": True} for m in ("acc", "acc_norm")])
    return cfg


def task_specs(names: list[str], jglue_dir: str | Path | None) -> list:
    """Harness task specs: our local tasks as config dicts, any other name passed through."""
    return [jcqa_local_config(jglue_dir) if n == "jcqa_local" else n for n in names]
