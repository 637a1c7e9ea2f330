"""suite=jcqa with the harness's template and suite=lm_eval (the harness's own code over our
remote-code model) score every question alike, prompts past the trained length included: JCQA
batches its questions (right-padded, per-sequence RoPE base), the harness sends one request per
forward, so any dependence of a score on its batch shows up as a disagreement here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from hydra import compose, initialize_config_dir  # noqa: E402

from anchormass.eval.runner import run_evaluation  # noqa: E402

from _hf_helpers import VOCAB, tiny_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["りんご", "みかん", "ぶどう", "もも", "なし", "すいか", "いちご", "かき", "くり"]
N_VALID = 8


def _rows(n: int, offset: int) -> list[dict]:
    return [{"q_id": offset + i, "question": f"果物{i}は" + "とても" * (i % 4) + "何？",
             **{f"choice{k}": WORDS[(i + 2 * k) % len(WORDS)] for k in range(5)}, "label": (i * 3) % 5}
            for i in range(n)]


@pytest.mark.parametrize("preset", ["anchormass_tiny", "standard_tiny"])
def test_jcqa_and_the_harness_agree_per_question(preset, tmp_path):
    tok = tiny_tokenizer(tmp_path)
    for name, rows in (("train-v1.3.json", _rows(12, 100)), ("valid-v1.3.json", _rows(N_VALID, 0))):
        (tmp_path / name).write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n",
                                     encoding="utf-8")
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=[
            "suite=[jcqa,lm_eval]", "tasks=[jcqa_local]", f"model={preset}", f"model.vocab_size={VOCAB}",
            # trained length 64: every 3-shot prompt (~150-250 tokens) is past it, and the batch of 8
            # questions pads most of them by tens of tokens
            "model.original_max_len=64", "model.init_std=0.2", "limits.max_extrapolation=null",
            f"tokenizer={tok}", f"eval.jcqa.dir={tmp_path}", "eval.jcqa.template=lm_eval_harness",
            "eval.jcqa.n_shots=3", f"eval.jcqa.limit={N_VALID}", "eval.jcqa.batch_questions=8",
            f"out_dir={tmp_path / 'run'}", "progress=false"])
    suites = json.loads((run_evaluation(cfg) / "results.json").read_text())["suites"]
    ours = suites["jcqa"]["items"]
    harness = sorted(suites["lm_eval"]["items"], key=lambda it: it["doc_id"])
    assert len(ours) == len(harness) == N_VALID
    gap = max(abs(a - b) for o, h in zip(ours, harness) for a, b in zip(o["loglik"], h["loglik"]))
    assert gap <= 1e-4
    assert [float(o["correct"]) for o in ours] == [h["acc"] for h in harness]
    assert [float(o["correct_norm"]) for o in ours] == [h["acc_norm"] for h in harness]


def test_exported_tokenizer_composes_half_width_voiced_kana(tmp_path):
    """JCommonsenseQA has shots such as 職場のﾎﾞｽ: SentencePiece's NFKC gives ボ, and the exported
    tokenizer must give the same ids (without NFC after its charsmap it gave ホ + a combining mark:
    3 more tokens in each of 4 of the 1,119 harness prompts, and a different score)."""
    from anchormass.data.tokenizer import Tokenizer
    from anchormass.hf.tokenizer_export import hf_tokenizer

    tok = Tokenizer.load(tiny_tokenizer(tmp_path))
    hf = hf_tokenizer(tok)
    for text in ("職場のﾎﾞｽを日本語でいうと？", "パソコンにﾃﾞーﾀ記憶させる", "ﾊﾟﾋﾟﾌﾟﾍﾟﾎﾟ", "ｶﾞｷﾞｸﾞｹﾞｺﾞ", "ボス データ"):
        assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(text), text
