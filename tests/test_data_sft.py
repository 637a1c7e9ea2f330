"""SFT data: the chat template, loss only on responses, Alpaca files, long-context retrieval examples."""

import json

import pytest
import torch

from anchormass.data.datamodule import SFTDataModule
from anchormass.data.longctx import LongContextSpec
from anchormass.data.prepare import prepare
from anchormass.data.sft import alpaca_records, chat_prompt, render_example
from anchormass.data.testing import tiny_pretrain
from anchormass.errors import ConfigError, DataError

RECORDS = [
    {"instruction": "What is 2 plus 3?", "input": "", "output": "2 plus 3 is 5."},
    {"instruction": "Repeat the sentence.", "input": "Alice found a red box.", "output": "Alice found a red box."},
    {"instruction": "How many names are in the list?", "input": "Bob, Emma", "output": "There are 2 names."},
] * 4


@pytest.fixture(scope="module")
def pre_dir(tmp_path_factory):
    return tiny_pretrain(tmp_path_factory.mktemp("pre") / "pre")


@pytest.fixture(scope="module")
def tokenizer(pre_dir):
    from anchormass.data.tokenizer import Tokenizer

    return Tokenizer.load(pre_dir / "tokenizer.model")


def response_text(tok, ids, mask):
    return tok.decode([i for i, m in zip(ids, mask) if m and i not in (tok.end_id, tok.eos_id)])


def test_template_masks_only_the_response(tokenizer):
    tok = tokenizer
    ids, mask = render_example(tok, "Repeat the sentence.", "Alice found a red box.", "Alice found a red box.",
                               system="Be brief.")
    n_prompt = len(chat_prompt(tok, "Repeat the sentence.\n\nAlice found a red box.", "Be brief."))
    assert ids[:n_prompt] == chat_prompt(tok, "Repeat the sentence.\n\nAlice found a red box.", "Be brief.")
    assert mask == [0] * n_prompt + [1] * (len(ids) - n_prompt)
    assert ids[0] == tok.bos_id and ids[n_prompt - 1] == tok.assistant_id and ids[-2:] == [tok.end_id, tok.eos_id]
    assert response_text(tok, ids, mask) == "Alice found a red box."
    assert ids.count(tok.system_id) == ids.count(tok.user_id) == ids.count(tok.assistant_id) == 1


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_alpaca_files_to_batches_with_response_only_targets(pre_dir, tmp_path, suffix, tokenizer):
    raw = tmp_path / f"alpaca{suffix}"
    raw.write_text(json.dumps(RECORDS) if suffix == ".json" else "\n".join(json.dumps(r) for r in RECORDS))
    out, meta = prepare({"name": "chat", "kind": "sft", "out_dir": str(tmp_path / "chat"), "val_fraction": 0.25,
                         "source": {"kind": "files", "paths": [str(raw)]},
                         "tokenizer": {"path": str(pre_dir / "tokenizer.model")}})
    assert meta["splits"]["train"]["examples"] + meta["splits"]["val"]["examples"] == len(RECORDS)
    dm = SFTDataModule(out, seq_len=64, global_batch_size=2, seed=0)
    outputs = {r["output"] for r in RECORDS}
    for batch in [next(iter(dm.train_dataloader()))] + list(dm.val_dataloader()):
        for inp, tgt in zip(batch["input_ids"], batch["targets"]):
            kept = tgt[tgt != -100].tolist()
            assert kept[-2:] == [tokenizer.end_id, tokenizer.eos_id]
            assert tokenizer.decode(kept[:-2]) in outputs
            # every target is the next input token; no loss inside the prompt
            pos = torch.nonzero(tgt != -100).flatten()
            assert torch.equal(inp[pos[:-1] + 1], tgt[pos[:-1]])
            assert inp[pos[0]].item() == tokenizer.assistant_id


def test_alpaca_missing_field_and_missing_tokenizer(pre_dir, tmp_path):
    with pytest.raises(DataError, match="no field 'output'"):
        list(alpaca_records([{"instruction": "x", "answer": "y"}]))
    raw = tmp_path / "a.jsonl"
    raw.write_text(json.dumps(RECORDS[0]))
    with pytest.raises(ConfigError, match="tokenizer.path is required"):
        prepare({"name": "c", "kind": "sft", "out_dir": str(tmp_path / "c"), "source": {"paths": [str(raw)]}})
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("lm_loss", [False, True])
def test_long_context_examples(pre_dir, tmp_path, tokenizer, lm_loss):
    out, meta = prepare({"name": "lc", "kind": "longctx", "out_dir": str(tmp_path / "lc"),
                         "longctx": {"source_dir": str(pre_dir), "length": 257, "n_train": 6, "n_val": 2,
                                     "n_facts": 3, "lm_loss": lm_loss}})
    dm = SFTDataModule(out, seq_len=256, global_batch_size=6, seed=0)
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (6, 256) and (batch["input_ids"] != tokenizer.pad_id).all()
    for inp, tgt in zip(batch["input_ids"], batch["targets"]):
        text = tokenizer.decode(inp.tolist())
        answer = tgt[-1 - 8:].tolist()
        value = tokenizer.decode([t for t in answer if t >= 0 and t != tokenizer.eos_id]).strip(" .")
        assert value.isdigit() and text.count(value) >= 1  # the fact was stated in the document
        n_loss = int((tgt != -100).sum())
        if lm_loss:
            assert n_loss > 200
        else:
            assert tgt[-1].item() == tokenizer.eos_id and n_loss <= 10
            assert tokenizer.decode(tgt[tgt != -100][:-1].tolist()).strip(" .") == value
    with pytest.raises(ConfigError):
        LongContextSpec(kinds=("passkey",), n_facts=2)
