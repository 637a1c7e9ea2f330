import json
from types import SimpleNamespace

import numpy as np
import torch

from anchormass.data.token_file import write_tokens
from anchormass.eval.callbacks import EvalCallback, load_preset
from anchormass.models import build_model
from anchormass.models.config import load_model_config


class Capture:
    def __init__(self):
        self.logged = []

    def log_metrics(self, metrics, step):
        self.logged.append((step, dict(metrics)))


def test_presets_merge_their_defaults():
    tiny, full = load_preset("cpu_tiny"), load_preset("full")
    assert tiny["ppl"]["target_len"] == 64 and full["ppl"]["target_len"] == 1024
    assert tiny["ppl"]["anchor_seed"] == full["ppl"]["anchor_seed"]  # inherited from full
    assert load_preset("cpu_tiny", {"ppl": {"n_anchors": 2}})["ppl"]["n_anchors"] == 2


def test_callback_runs_suites_on_the_live_model_and_logs(tmp_path):
    rng = np.random.default_rng(0)
    write_tokens(tmp_path / "val.bin", rng.integers(0, 64, size=1500), 64)
    torch.manual_seed(0)
    model = build_model(load_model_config("anchormass_tiny").replace(vocab_size=64)).train()
    module = SimpleNamespace(model=model, hparams={"tokenizer_path": None})
    logger = Capture()
    trainer = SimpleNamespace(global_step=0, is_global_zero=True, loggers=[logger])
    cb = EvalCallback(every_n_steps=2, suites=["ppl"], preset="cpu_tiny", data_dir=str(tmp_path),
                      out_root=str(tmp_path / "cb"), overrides={"ppl": {"n_anchors": 2, "contexts": [0, 64]}})
    for step in (1, 2, 3):
        trainer.global_step = step
        cb.on_train_batch_end(trainer, module, None, None, step)
    assert [s for s, _ in logger.logged] == [2]  # only every N steps
    step, metrics = logger.logged[0]
    assert set(metrics) == {"eval/ppl/anchormass_tiny/ctx0/ppl", "eval/ppl/anchormass_tiny/ctx64/ppl"}
    assert all(np.isfinite(v) and v > 1 for v in metrics.values())
    assert model.training  # the training mode is restored
    res = json.loads((tmp_path / "cb" / "step0000002" / "results.json").read_text())
    assert res["models"][0]["source"] == "training step 2"
    cb.on_train_end(trainer, module)  # step 3: a final evaluation
    assert [s for s, _ in logger.logged] == [2, 3]
