"""`lm_eval --model hf --include_path <ours> --tasks jcqa_local` on an exported folder, offline,
scores each question as `evaluate.py suite=lm_eval` does on the checkpoint (issue 24). The include
folder is written, and the command printed, by
`python -m anchormass.hf.lm_eval_tasks <JGLUE folder> <include folder> <exported folder>`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from hydra import compose, initialize_config_dir  # noqa: E402

from anchormass.eval.runner import run_evaluation  # noqa: E402

from _hf_helpers import tiny_checkpoint, tiny_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FRUITS = ["りんご", "みかん", "ぶどう", "もも", "なし"]
LM_EVAL = shutil.which("lm_eval", path=str(Path(sys.executable).parent)) or "lm_eval"


def jcqa_files(d: Path) -> Path:
    rows = [{"q_id": i, "question": f"果物{i}は何？", **{f"choice{k}": FRUITS[(i + k) % 5] for k in range(5)},
             "label": i % 5} for i in range(8)]
    for name in ("train-v1.3.json", "valid-v1.3.json"):
        (d / name).write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    return d


def fake_export(folder: Path, **config) -> Path:
    """An exported folder as far as the printed command depends on it: its config.json."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def lm_eval_tasks(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "anchormass.hf.lm_eval_tasks", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_the_include_folder_is_one_line_on_a_missing_jglue_folder(tmp_path):
    export = fake_export(tmp_path / "exp", model_type="llama", max_position_embeddings=256)
    proc = lm_eval_tasks(tmp_path / "nowhere", tmp_path / "inc", export)
    assert proc.returncode == 2 and proc.stderr.startswith("error: JCommonsenseQA file not found")
    assert not (tmp_path / "inc").exists()


@pytest.mark.parametrize("config, model_args", [
    ({"model_type": "anchormass", "auto_map": {"AutoModelForCausalLM": "modeling.X"}}, ",trust_remote_code=True"),
    ({"model_type": "llama", "max_position_embeddings": 256}, ",max_length=2048"),   # past the trained 256
])
def test_the_printed_harness_command_fits_the_export(tmp_path, config, model_args):
    """Before: `--model_args pretrained=<exported folder>` for either, which fails as printed."""
    import shlex

    export = fake_export(tmp_path / "my export", **config)   # a space: the printed command quotes it
    proc = lm_eval_tasks(jcqa_files(tmp_path), tmp_path / "inc", export)
    assert proc.returncode == 0, proc.stderr
    command = shlex.split(proc.stdout.strip())
    assert command[:2] == ["lm_eval", "--model"] and "<" not in proc.stdout
    assert command[command.index("--model_args") + 1] == f"pretrained={export.resolve()}{model_args}"
    assert command[command.index("--include_path") + 1] == str((tmp_path / "inc").resolve())
    assert (tmp_path / "inc" / "jcqa_local.yaml").is_file()
    if config["model_type"] == "llama":
        assert "max_position_embeddings (256, the trained length)" in proc.stderr


REAL_JCQA = ROOT.parent / "shared" / "data" / "jglue" / "jcommonsenseqa-v1.3"


@pytest.mark.slow  # two harness runs (~1 min on 2 cores)
@pytest.mark.parametrize("source", ["synthetic", pytest.param("real", marks=pytest.mark.skipif(
    not REAL_JCQA.is_dir(), reason="../shared/data (real JGLUE JCommonsenseQA) not present"))])
def test_lm_eval_cli_on_the_export_scores_each_question_as_the_suite(tmp_path, source):
    from anchormass.hf.export import export_checkpoint

    data = jcqa_files(tmp_path) if source == "synthetic" else REAL_JCQA  # real: long 3-shot prompts
    tok = tiny_tokenizer(tmp_path / "tok")
    ckpt = tiny_checkpoint(tmp_path / "am.ckpt", "anchormass_tiny", tok)
    folder = export_checkpoint(ckpt, tmp_path / "exported")

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("evaluate", overrides=["suite=lm_eval", "tasks=[jcqa_local]", f"ckpt={ckpt}",
                                             f"eval.jcqa.dir={data}", "eval.lm_eval.limit=4",
                                             f"out_dir={tmp_path / 'suite'}", "progress=false"])
    suite = json.loads((run_evaluation(cfg) / "results.json").read_text())["suites"]["lm_eval"]["items"]

    made = lm_eval_tasks(data, tmp_path / "include", folder)
    assert made.returncode == 0, made.stderr
    import shlex

    printed = shlex.split(made.stdout.strip())   # the command as printed, plus the test's limits
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    cli = subprocess.run([LM_EVAL, *printed[1:], "--limit", "4", "--device", "cpu", "--log_samples",
                          "--output_path", str(tmp_path / "cli")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert cli.returncode == 0, cli.stderr[-3000:]
    [samples] = list((tmp_path / "cli").rglob("samples_jcqa_local_*.jsonl"))
    rows = sorted((json.loads(line) for line in samples.read_text().splitlines()), key=lambda r: r["doc_id"])
    assert [r["doc_id"] for r in rows] == [it["doc_id"] for it in suite] == [0, 1, 2, 3]
    for row, item in zip(rows, suite):
        assert (row["acc"], row["acc_norm"]) == (item["acc"], item["acc_norm"])
        assert [float(r[0][0]) for r in row["resps"]] == pytest.approx(item["loglik"], abs=1e-5)


@pytest.mark.slow  # one harness run
def test_the_printed_command_runs_on_a_llama_export(tmp_path):
    import shlex

    from anchormass.hf.export import export_checkpoint

    tok = tiny_tokenizer(tmp_path / "tok")
    folder = export_checkpoint(tiny_checkpoint(tmp_path / "std.ckpt", "standard_tiny", tok), tmp_path / "exported")
    made = lm_eval_tasks(jcqa_files(tmp_path), tmp_path / "include", folder)
    assert made.returncode == 0, made.stderr
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    cli = subprocess.run([LM_EVAL, *shlex.split(made.stdout.strip())[1:], "--limit", "2", "--device", "cpu",
                          "--log_samples", "--output_path", str(tmp_path / "cli")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert cli.returncode == 0, cli.stderr[-3000:]
    [samples] = list((tmp_path / "cli").rglob("samples_jcqa_local_*.jsonl"))
    assert len(samples.read_text().splitlines()) == 2
