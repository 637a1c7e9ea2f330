r"""JCommonsenseQA questions from JGLUE JSON lines (local) or a `datasets` hub name, and prompts.

A question is {"q_id", "question", "choices": [5 strings], "label"}. A prompt is the template's
description, `n_shots` solved training examples, then the question; the continuation scored for
each choice is `continuation` formatted with that choice. Two presets (`template: <name>`; a dict
overrides fields of `simple`):

- `simple`: our short Japanese layout; the same shots (drawn once from train with `shot_seed`)
  precede every question, so the prompt prefix is fixed.
- `lm_eval_harness`: lm-evaluation-harness's `ja_leaderboard_jcommonsenseqa` task exactly (its
  description, `### 指示` / `### 入力` / `### 応答` layout, "- choice" lines, "\n" between a prompt and
  its answer, "\n\n" between shots), with its shot draw: one `random.Random(shot_seed)` (the
  harness's default fewshot seed is 1234) from which each validation question, in file order,
  samples its own 3 training questions.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from anchormass.errors import ConfigError, DataError

# Fields: {choices} in `shot` / `query` = each choice formatted with `choice`, joined by
# `choices_sep`; {answer} = the correct choice text; `continuation` = what is scored per choice.
PRESETS = {
    "simple": {
        "description": "",
        "shot": "質問：{question}\n選択肢：{choices}\n答え：{answer}\n\n",
        "query": "質問：{question}\n選択肢：{choices}\n答え：",
        "choice": "{choice}",
        "choices_sep": "、",
        "continuation": "{choice}",
        "shot_sampling": "fixed",
    },
    "lm_eval_harness": {
        "description": ("以下は、タスクを説明する指示と、文脈のある入力の組み合わせです。"
                        "要求を適切に満たす応答を書きなさい。\n\n"),
        "shot": ("### 指示：\n出力は以下から選択してください：\n{choices}\n"
                 "### 入力：\n{question}\n\n### 応答：\n{answer}\n\n"),
        "query": "### 指示：\n出力は以下から選択してください：\n{choices}\n### 入力：\n{question}\n\n### 応答：",
        "choice": "- {choice}\n",
        "choices_sep": "",
        "continuation": "\n{choice}",
        "shot_sampling": "per_question",
    },
}
TEMPLATE = PRESETS["simple"]
SHOT_SAMPLING = ("fixed", "per_question")


def resolve_template(spec) -> dict:
    """A preset name, or a dict of fields over `simple` (a dict may name its base: preset=...)."""
    if isinstance(spec, str):
        if spec not in PRESETS:
            raise ConfigError(f"jcqa.template: unknown preset {spec!r}; choose one of {sorted(PRESETS)}")
        return dict(PRESETS[spec])
    spec = dict(spec or {})
    base = spec.pop("preset", "simple")
    template = {**resolve_template(str(base)), **spec}
    for key in PRESETS["simple"]:
        if not isinstance(template.get(key), str):
            raise ConfigError(f"jcqa.template.{key} must be a string")
    if template["shot_sampling"] not in SHOT_SAMPLING:
        raise ConfigError(f"jcqa.template.shot_sampling must be one of {SHOT_SAMPLING}")
    return template


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
        from anchormass.extras import require

        require("data", "jcqa questions from the hub")
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


def shots_per_question(train: list[dict], n_questions: int, n_shots: int, seed: int, sampling: str) -> list[list[dict]]:
    """The solved examples before each question: one draw shared by all ("fixed"), or one draw per
    question, in order, from a single generator seeded once ("per_question", as the harness)."""
    if not n_shots:
        return [[] for _ in range(n_questions)]
    if sampling == "fixed":
        return [pick_shots(train, n_shots, seed)] * n_questions
    if n_shots > len(train):
        raise DataError(f"jcqa: {n_shots} shots requested but train has {len(train)} questions")
    rng = random.Random(seed)
    return [rng.sample(train, n_shots) for _ in range(n_questions)]


def render(template: dict, q: dict, answer: bool) -> str:
    choices = template["choices_sep"].join(template["choice"].format(choice=c) for c in q["choices"])
    if answer:
        return template["shot"].format(question=q["question"], choices=choices, answer=q["choices"][q["label"]])
    return template["query"].format(question=q["question"], choices=choices)


def build_prompt(template: dict, shots: list[dict], q: dict) -> str:
    return (template["description"] + "".join(render(template, s, answer=True) for s in shots)
            + render(template, q, answer=False))


def continuations(template: dict, q: dict) -> list[str]:
    """The text scored for each choice, following the prompt directly."""
    return [template["continuation"].format(choice=c) for c in q["choices"]]
