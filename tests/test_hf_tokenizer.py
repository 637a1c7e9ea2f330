"""The exported tokenizer: AutoTokenizer gives our SentencePiece ids (real Japanese text when
../shared/data is present), the special ids, and the chat SFT format through its chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from anchormass.data.sft import chat_prompt, render_example, user_text  # noqa: E402
from anchormass.data.tokenizer import ROLE_MARKERS, Tokenizer, train_tokenizer  # noqa: E402
from anchormass.hf.tokenizer_export import export_tokenizer  # noqa: E402

from _hf_helpers import tiny_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
AOZORA = SHARED / "aozora" / "wagahai_wa_neko_de_aru.txt"
JCQA = SHARED / "jglue" / "jcommonsenseqa-v1.3" / "valid-v1.3.json"
EDGE_CASES = ["", " 先頭と末尾の空白 ", "全角ＡＢＣ１２３と半角ｶﾀｶﾅ①", "数字 0123456789 と 3.14", "改行\n\n二つ\tタブ",
              "絵文字😀と未知の字𠮷", "English words, too."]


def _exported(tok: Tokenizer, folder: Path):
    from transformers import AutoTokenizer

    export_tokenizer(tok, folder)
    return AutoTokenizer.from_pretrained(folder)


def _mismatches(tok: Tokenizer, hf, texts: list[str]) -> list[str]:
    return [t for t in texts if hf.encode(t, add_special_tokens=False) != tok.encode(t)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    base = tmp_path_factory.mktemp("hf_tok")
    tok = Tokenizer.load(tiny_tokenizer(base))
    return tok, _exported(tok, base / "hf")


def test_special_ids_and_plain_text(tiny):
    tok, hf = tiny
    assert (hf.pad_token_id, hf.unk_token_id, hf.bos_token_id, hf.eos_token_id) == (0, 1, 2, 3)
    assert hf.convert_tokens_to_ids(list(ROLE_MARKERS)) == [tok.system_id, tok.user_id, tok.assistant_id, tok.end_id]
    assert len(hf) == tok.vocab_size
    assert _mismatches(tok, hf, EDGE_CASES) == []
    text = "吾輩は猫である。名前はまだ無い。"
    assert hf.decode(hf.encode(text, add_special_tokens=False)) == tok.decode(tok.encode(text))


def test_role_markers_are_special_tokens_between_separately_encoded_turns(tiny):
    """As in anchormass.data.sft: each turn's text is encoded on its own (its own dummy prefix)."""
    tok, hf = tiny
    got = hf.encode("<|user|>質問<|end|><|assistant|>", add_special_tokens=False)
    assert got == [tok.user_id, *tok.encode("質問"), tok.end_id, tok.assistant_id]


def test_chat_template_gives_the_sft_ids(tiny):
    tok, hf = tiny
    system, user, answer = "丁寧に答える。", user_text("次の質問に答えて", "りんごは何色？"), "赤です。"
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    prompt = hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert list(prompt) == chat_prompt(tok, user, system)
    full = hf.apply_chat_template([msgs[1], {"role": "assistant", "content": answer}], tokenize=True, return_dict=False)
    assert list(full) == render_example(tok, "次の質問に答えて", "りんごは何色？", answer)[0]


@pytest.mark.skipif(not (AOZORA.is_file() and JCQA.is_file()), reason="../shared/data (Aozora, JCQA) not present")
@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_real_japanese_text_round_trip(tmp_path, model_type):
    novel = AOZORA.read_text(encoding="utf-8", errors="replace")
    tok = train_tokenizer([novel[:60_000]], tmp_path / "tok.model", vocab_size=3000, model_type=model_type,
                          hard_vocab_limit=False)
    hf = _exported(tok, tmp_path / "hf")
    questions = [json.loads(line) for line in JCQA.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = [novel[i:i + 400] for i in range(0, len(novel), 4000)]  # held-out text too (past 60K)
    texts += [q["question"] + "\n" + "、".join(q[f"choice{k}"] for k in range(5)) for q in questions]
    assert len(texts) > 1000
    assert _mismatches(tok, hf, texts) == []
