"""The default evaluation preset (eval=cpu_tiny) on a model trained with the demo tokenizer:
every passkey trial, the robustness phrasings included, fits its length (issue 24: "passkey
length 160 is shorter than the needle" with the Japanese needle in byte-fallback pieces)."""

import json
from pathlib import Path

from hydra import compose, initialize_config_dir

from anchormass.eval.runner import run_evaluation

from _train_helpers import tiny_datasets

ROOT = Path(__file__).resolve().parents[1]


def test_default_preset_passkey_runs_with_the_demo_tokenizer(tmp_path):
    demo = tiny_datasets(tmp_path / "data")["pretrain"]  # the demo corpus' own tokenizer (400 pieces here)
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("evaluate", overrides=["suite=passkey", "model=anchormass_tiny", "model.vocab_size=400",
                                             f"tokenizer={demo / 'tokenizer.model'}", f"out_dir={tmp_path / 'run'}",
                                             "progress=false"])
    assert cfg.eval.passkey.lengths == [160, 320]  # the preset itself, unchanged sizes
    res = json.loads((run_evaluation(cfg) / "results.json").read_text())["suites"]["passkey"]
    phrasings = {r["phrasing"] for r in res["items"]}
    assert phrasings == {"plain", "prefix", "paraphrase", "memo", "dialogue"}
    assert all(r["status"] == "ok" for r in res["items"])
