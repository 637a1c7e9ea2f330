"""JCommonsenseQA questions from JGLUE JSON lines (local) or a `datasets` hub name, and prompts.

A question is {"q_id", "question", "choices": [5 strings], "label"}. The prompt is `n_shots`
solved examples drawn once from train with `shot_seed` (the same shots for every question, so
the prompt template is fixed), then the question; each choice's text is the continuation.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from anchormass.errors import ConfigError, DataError

TEMPLATE = {
    # {choices} = the choice texts joined by `choices_sep`; {answer} = the correct choice text.
    "shot": "質問：{question}\n選択肢：{choices}\n答え：{answer}\n\n",
    "query": "質問：{question}\n選択肢：{choices}\n答え：",
    "choices_sep": "、",
}
LOCAL_NAMES = {"validation": "valid-v1.3.json", "train": "train-v1.3.json"}


def _normalise(row: dict, where: str) -> dict:
    try:
        choices = list(row["choices"]) if "choices" in row else [row[f"choice{i}"] for i in range(5)]
        q = {"q_id": row.get("q_id"), "question": str(row["question"]), "choices": [str(c) for c in choices],
             "label": int(row["label"])}
    except (KeyError, TypeError, ValueError) as err:
        raise DataError(f"{where}: not a JCommonsenseQA record (missing/invalid {err})") from None
    if not 0 <= q["label"] < len(q["choices"]):
        raise DataError(f"{where}: label {q['label']} outside 0..{len(q['choices']) - 1}")
    return q


def read_jsonl(path: str | Path) -> list[dict]:
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError(f"JCommonsenseQA file not found: {path}")
    out = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{n}: invalid JSON ({err.msg})") from None
            out.append(_normalise(row, f"{path}:{n}"))
    if not out:
        raise DataError(f"{path}: no questions")
    return out


def load_split(cfg: dict, split: str) -> tuple[list[dict], str]:
    """(questions, source description) for split 'validation' or 'train'."""
    key = "valid" if split == "validation" else "train"
    if cfg.get(key):
        return read_jsonl(cfg[key]), str(Path(str(cfg[key])).expanduser())
    if cfg.get("dir"):
        path = Path(str(cfg["dir"])).expanduser() / LOCAL_NAMES[split]
        return read_jsonl(path), str(path)
    if cfg.get("hub"):
        import datasets

        try:
            ds = datasets.load_dataset(cfg["hub"], cfg.get("hub_config"), split=cfg.get(f"hub_{key}_split", split))
        except Exception as err:  # offline, unknown name, ...: one line
            raise DataError(f"cannot load {cfg['hub']} ({cfg.get('hub_config')}) split {split}: "
                            f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from None
        return [_normalise(dict(r), f"{cfg['hub']}[{i}]") for i, r in enumerate(ds)], f"hub:{cfg['hub']}/{split}"
    raise ConfigError("jcqa needs data: eval.jcqa.dir=<folder with valid-v1.3.json>, eval.jcqa.valid=<jsonl> "
                      "(+ train for shots) or eval.jcqa.hub=<datasets name>")


def pick_shots(train: list[dict], n_shots: int, seed: int) -> list[dict]:
    if n_shots > len(train):
        raise DataError(f"jcqa: {n_shots} shots requested but train has {len(train)} questions")
    return random.Random(seed).sample(train, n_shots)


def render(template: dict, q: dict, answer: bool) -> str:
    choices = template["choices_sep"].join(q["choices"])
    if answer:
        return template["shot"].format(question=q["question"], choices=choices, answer=q["choices"][q["label"]])
    return template["query"].format(question=q["question"], choices=choices)


def build_prompt(template: dict, shots: list[dict], q: dict) -> str:
    return "".join(render(template, s, answer=True) for s in shots) + render(template, q, answer=False)
