"""`lm_eval --model hf --include_path <ours> --tasks jcqa_local` on an exported folder, offline,
scores each question as `evaluate.py suite=lm_eval` does on the checkpoint (issue 24). The include
folder is written by `python -m anchormass.hf.lm_eval_tasks <JGLUE folder> <include folder>`."""

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


def test_the_include_folder_is_one_line_on_a_missing_jglue_folder(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "anchormass.hf.lm_eval_tasks", str(tmp_path / "nowhere"),
                           str(tmp_path / "inc")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: JCommonsenseQA file not found")
    assert not (tmp_path / "inc").exists()


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

    inc = tmp_path / "include"
    made = subprocess.run([sys.executable, "-m", "anchormass.hf.lm_eval_tasks", str(data), str(inc)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    cli = subprocess.run([LM_EVAL, "--model", "hf", "--model_args", f"pretrained={folder},trust_remote_code=True",
                          "--include_path", str(inc), "--tasks", "jcqa_local", "--limit", "4", "--batch_size", "1",
                          "--device", "cpu", "--log_samples", "--output_path", str(tmp_path / "cli")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert cli.returncode == 0, cli.stderr[-3000:]
    [samples] = list((tmp_path / "cli").rglob("samples_jcqa_local_*.jsonl"))
    rows = sorted((json.loads(line) for line in samples.read_text().splitlines()), key=lambda r: r["doc_id"])
    assert [r["doc_id"] for r in rows] == [it["doc_id"] for it in suite] == [0, 1, 2, 3]
    for row, item in zip(rows, suite):
        assert (row["acc"], row["acc_norm"]) == (item["acc"], item["acc_norm"])
        assert [float(r[0][0]) for r in row["resps"]] == pytest.approx(item["loglik"], abs=1e-5)
