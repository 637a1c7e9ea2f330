"""An imported Hugging Face tokenizer folder behind the project's tokenizer interface: the loader,
round trips, special ids, token files, the chat template against transformers' own rendering,
SFT examples, prepare_data on a few KB of HTML (cleaner, repeats dropped before the split), and
the passkey haystack. The tokenizer is a tiny byte-level BPE trained here (no model files)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from anchormass.data.dataset_dir import PreparedDataset
from anchormass.data.dedup import deduplicated
from anchormass.data.hf_tokenizer import HFTokenizer
from anchormass.data.html_text import html_text
from anchormass.data.merge import merge_shards
from anchormass.data.prepare import prepare
from anchormass.data.sft import chat_prompt, render_example
from anchormass.data.sources import SourcePart
from anchormass.data.token_file import TokenWriter, open_tokens, write_tokens
from anchormass.data.tokenizer import Tokenizer, train_tokenizer
from anchormass.data.tokenizer_loader import load_tokenizer
from anchormass.errors import ConfigError, DataError

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# A ChatML template in the style of SmolLM2's (written for this test): a default system turn when
# the chat has none, one `<|im_start|>role\n...<|im_end|>\n` block per message.
TEMPLATE = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}"
            "{{ '<|im_start|>system\nBe helpful.<|im_end|>\n' }}{% endif %}"
            "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TEXT = ("The interpreter reads a line, runs it and prints the result. A module is a file of "
        "definitions; import it to use them. Lists, tuples and dictionaries hold values. " * 20)
PAGE = """<!DOCTYPE html><html><head><title>T</title><style>p {{color: red}}</style>
<script>var x = "<p>not text</p>";</script></head><body>
<nav role="navigation"><a href="index.html">Index</a> | <a href="next.html">Next</a></nav>
<div class="body" role="main"><section><h1>{title}<a class="headerlink" href="#t">¶</a></h1>
<p>{para}</p>
<ul><li><p>First &amp; foremost: items are paragraphs.</p></li><li>Second   item,
 on two lines.</li></ul>
<div class="highlight"><pre><span>def</span> f(x):
    return x &lt; 2
</pre></div>
<p>Shared paragraph that every page of this small site repeats word for word.</p>
</section></div><footer>Copyright notice of the site.</footer></body></html>"""


def make_folder(folder: Path, template: str | None = TEMPLATE, vocab_size: int = 400) -> Path:
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, models, pre_tokenizers, trainers

    backend = Backend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator([TEXT], trainer)
    folder.mkdir(parents=True, exist_ok=True)
    backend.save(str(folder / "tokenizer.json"))
    config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
              "unk_token": {"__type": "AddedToken", "content": "<|endoftext|>", "special": True},
              "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if template:
        (folder / "chat_template.jinja").write_text(template)
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("hf_tok") / "tokenizer")


@pytest.fixture(scope="module")
def tok(folder):
    return load_tokenizer(folder)


def test_loader_picks_by_path(tmp_path, folder, tok):
    assert isinstance(tok, HFTokenizer) and tok.kind == "huggingface" and tok.file_name == "tokenizer"
    sp = train_tokenizer([TEXT], tmp_path / "sp.model", 300, model_type="bpe", hard_vocab_limit=False)
    assert isinstance(load_tokenizer(tmp_path / "sp.model"), Tokenizer) and sp.kind == "sentencepiece"
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="without tokenizer.json"):
        load_tokenizer(tmp_path / "empty")
    with pytest.raises(DataError, match="not found"):
        load_tokenizer(tmp_path / "nothing")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer.json").write_text("{not json")
    with pytest.raises(DataError, match="not a `tokenizers` tokenizer"):
        load_tokenizer(tmp_path / "bad")


@pytest.mark.parametrize("text", ["The interpreter reads a line.", "Unseen: zebra quokka 0123456789!",
                                  "  two  spaces\nand\ttabs  ", "é ü 日本語 😀", "<|im_end|> inside text"])
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.encode_batch([text, text], num_threads=2) == [ids, ids]


def test_special_ids_and_checksum(tmp_path, folder, tok):
    ids = {t: tok.token_id(t) for t in SPECIALS}
    assert (tok.unk_id, tok.bos_id, tok.eos_id, tok.pad_id) == (ids["<|endoftext|>"], ids["<|im_start|>"],
                                                                ids["<|im_end|>"], ids["<|im_end|>"])
    assert tok.encode("<|im_end|>") == [tok.eos_id]  # an added token in text is that token
    assert tok.vocab_size == tok.backend.get_vocab_size(with_added_tokens=True) and tok.token_id("no such") is None
    assert tok.special_ids() == {"pad": tok.pad_id, "unk": tok.unk_id, "bos": tok.bos_id, "eos": tok.eos_id}
    # the chat template is part of what the checksum covers; a copy reads the same
    other = load_tokenizer(make_folder(tmp_path / "other", template=TEMPLATE + " "))
    assert other.checksum != tok.checksum
    assert load_tokenizer(tok.save(tmp_path / "copy")).checksum == tok.checksum
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (tmp_path / "noeos").mkdir()
    (tmp_path / "noeos" / "tokenizer.json").write_bytes((folder / "tokenizer.json").read_bytes())
    (tmp_path / "noeos" / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": None}))
    with pytest.raises(DataError, match="no eos_token"):
        load_tokenizer(tmp_path / "noeos")


def test_token_files_refuse_a_vocabulary_past_uint16(tmp_path):
    """A vocabulary over 65,536 ids would wrap in uint16 files: writer, reader and tokenizer refuse it."""
    with pytest.raises(DataError, match="does not fit uint16"):
        TokenWriter(tmp_path / "big.bin", 70_000)
    write_tokens(tmp_path / "ok.bin", np.array([1, 2, 3]), 100)
    side = json.loads((tmp_path / "ok.bin.json").read_text())
    (tmp_path / "ok.bin.json").write_text(json.dumps({**side, "vocab_size": 70_000}))
    with pytest.raises(DataError, match="does not fit uint16"):
        open_tokens(tmp_path / "ok.bin")
    from tokenizers import Tokenizer as Backend
    from tokenizers import models

    big = tmp_path / "big"
    big.mkdir()
    Backend(models.WordLevel({f"w{i}": i for i in range(65_537)}, unk_token="w0")).save(str(big / "tokenizer.json"))
    (big / "tokenizer_config.json").write_text(json.dumps({"eos_token": "w1"}))
    with pytest.raises(DataError, match="do not fit the uint16"):
        load_tokenizer(big)


def _messages(system: bool, turns: int) -> list[dict]:
    chat = [{"role": "system", "content": "You answer briefly."}] if system else []
    for i in range(turns):
        chat += [{"role": "user", "content": f"Question {i}: what is 2 + {i}?"},
                 {"role": "assistant", "content": f"It is {2 + i}."}]
    return chat


@pytest.mark.parametrize("system,turns,gen", [(False, 1, True), (True, 1, True), (True, 2, False), (False, 2, False)])
def test_chat_template_as_transformers_renders_it(folder, tok, system, turns, gen):
    transformers = pytest.importorskip("transformers")
    reference = transformers.PreTrainedTokenizerFast.from_pretrained(str(folder))
    messages = _messages(system, turns)[:-1] if gen else _messages(system, turns)
    want = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    assert tok.apply_chat_template(messages, add_generation_prompt=gen) == want
    assert tok.encode(want) == reference.encode(want, add_special_tokens=False)


def test_sft_example_uses_the_tokenizers_template(tok):
    ids, mask = render_example(tok, "Add the numbers.", "2 and 3", "5", system=None)
    prompt = chat_prompt(tok, "Add the numbers.\n\n2 and 3")
    assert ids[:len(prompt)] == prompt and mask == [0] * len(prompt) + [1] * (len(ids) - len(prompt))
    assert tok.decode(prompt) == ("<|im_start|>system\nBe helpful.<|im_end|>\n<|im_start|>user\nAdd the numbers."
                                  "\n\n2 and 3<|im_end|>\n<|im_start|>assistant\n")
    assert tok.decode(ids[len(prompt):]) == "5<|im_end|>\n"  # the answer and the turn's end are the loss targets


def test_sft_without_a_template_or_role_markers_is_refused(tmp_path):
    plain = load_tokenizer(make_folder(tmp_path / "plain", template=None))
    with pytest.raises(DataError, match="no chat template"):
        chat_prompt(plain, "hello")


def test_html_cleaner():
    text = html_text(PAGE.format(title="Title &lt;1&gt;", para="A   paragraph\n with <code>inline code</code>."))
    assert text.split("\n\n") == [
        "Title <1>", "A paragraph with inline code.", "First & foremost: items are paragraphs.",
        "Second item, on two lines.", "def f(x):\n    return x < 2",
        "Shared paragraph that every page of this small site repeats word for word."]
    # without a main part the whole body is read (navigation, scripts and styles still not)
    page = "<html><body><nav>Menu</nav><p>One</p><p>Two</p><script>x()</script></body></html>"
    assert html_text(page) == "One\n\nTwo"


def test_dedup_drops_repeats_across_documents():
    shared = "A paragraph long enough to count as held-out text, repeated."
    texts = [f"Doc one.\n\n{shared}", f"Note\n\n{shared}\n\nDoc two has its own text.", f"Doc one.\n\n{shared}",
             "Note"]
    part = SourcePart(texts=lambda: iter(texts), cleaners=(), chunk_chars=None, limit=None, desc="t")
    out = [list(p.texts()) for p in deduplicated([part, part], min_chars=20)]
    # the second source repeats the first whole: nothing of it is new
    assert out == [[f"Doc one.\n\n{shared}", "Note\n\nDoc two has its own text."], []]


def test_prepare_html_corpus_with_the_hf_tokenizer(tmp_path, folder, tok):
    pages = tmp_path / "pages"
    pages.mkdir()
    for i in range(12):
        para = f"Page {i} explains topic number {i} in a sentence of its own, with words such as {i * 7}."
        (pages / f"p{i:02d}.html").write_text(PAGE.format(title=f"Topic {i}", para=para), encoding="utf-8")
    (pages / "p99.html").write_text((pages / "p03.html").read_text(encoding="utf-8"), encoding="utf-8")  # a copy

    def run(workers: int, **shard):
        return prepare({"name": "docs", "out_dir": str(tmp_path / f"docs{workers}"), "val_fraction": 0.3,
                        "source": {"kind": "files", "paths": [str(pages / "*.html")], "format": "text"},
                        "cleaners": ["html"], "dedup_min_chars": 40, "num_workers": workers, "block_docs": 4,
                        "tokenizer": {"path": str(folder), "document_end": "<|endoftext|>"}, **shard})

    out, meta = run(1)
    assert (meta["tokenizer"], meta["tokenizer_kind"]) == ("tokenizer", "huggingface")
    assert meta["vocab_size"] == tok.vocab_size
    assert meta["document_end_id"] == tok.token_id("<|endoftext|>")
    data = PreparedDataset(out)
    assert isinstance(data.tokenizer, HFTokenizer) and data.tokenizer.checksum == tok.checksum
    docs = {s: tok.decode(data.tokens(s)).split("<|endoftext|>")[:-1] for s in ("train", "val")}
    assert sum(len(d) for d in docs.values()) == 12  # the copied page is dropped
    assert all(d.startswith("Topic ") for split in docs.values() for d in split)
    paragraphs = {s: {p for d in ds for p in d.split("\n\n") if len(p) >= 40} for s, ds in docs.items()}
    assert not paragraphs["train"] & paragraphs["val"]  # no held-out paragraph is also a training one
    assert sum("repeats word for word" in d for split in docs.values() for d in split) == 1
    # two worker processes (each loads the folder's copy of the tokenizer), and two shards merged
    # (each deduplicating the whole stream, encoding its own blocks), write the same files
    out2, _ = run(2)
    for i in range(2):
        run(1, num_shards=2, shard_index=i)
    merged, _ = merge_shards([str(tmp_path / "docs1.shard-*-of-2")], str(tmp_path / "merged"))
    assert load_tokenizer(merged / "tokenizer").checksum == tok.checksum
    for name in ("train.bin", "val.bin", "train.bin.json", "val.bin.json"):
        assert (out2 / name).read_bytes() == (out / name).read_bytes() == (merged / name).read_bytes()


def test_document_end_must_be_a_token(tmp_path, folder):
    (tmp_path / "a.txt").write_text("one document\n")
    with pytest.raises(ConfigError, match="document_end"):
        prepare({"name": "x", "out_dir": str(tmp_path / "x"), "val_fraction": 0.5,
                 "source": {"kind": "files", "paths": [str(tmp_path / "a.txt")]},
                 "tokenizer": {"path": str(folder), "document_end": "<|no such token|>"}})


def test_passkey_haystack_and_eval_loading(folder, tok):
    from anchormass.eval.items import Haystack, make_trial
    from anchormass.eval.loading import load_tokenizer as eval_tokenizer
    from anchormass.eval.loading import tokenizer_path

    path = tokenizer_path({"tokenizer": str(folder)}, [])
    assert isinstance(eval_tokenizer(path, []), HFTokenizer)
    trial = make_trial(300, 0.5, seed=1)
    ids = Haystack(tok, filler="classic_en", lang="en").build(trial)
    assert len(ids) == 300 and trial.key in tok.decode(ids)


def test_prepare_chat_sft_with_the_tokenizers_template(tmp_path, folder, tok):
    out, meta = prepare({"name": "chat", "kind": "sft", "out_dir": str(tmp_path / "chat"), "val_fraction": 0.2,
                         "source": {"kind": "demo_chat", "params": {"n": 20, "seed": 1}},
                         "tokenizer": {"path": str(folder)}})
    assert meta["template"].startswith("the tokenizer's own") and meta["tokenizer"] == "tokenizer"
    data = PreparedDataset(out)
    mask, offsets = data.sft_arrays("train")
    first = np.asarray(data.tokens("train")[offsets[0]:offsets[1]])
    assert tok.decode(first).startswith("<|im_start|>system\nBe helpful.<|im_end|>\n<|im_start|>user\n")
    assert tok.decode(first[np.asarray(mask[offsets[0]:offsets[1]]) == 1]).endswith("<|im_end|>\n")



def test_export_and_harness_wrapper_keep_the_imported_tokenizer(tmp_path, tok):
    """hf/tokenizer_export.py (exports, lm-eval): the imported tokenizer as transformers sees it."""
    pytest.importorskip("transformers")
    from anchormass.hf.tokenizer_export import export_tokenizer, hf_tokenizer

    wrapped = hf_tokenizer(tok)
    assert wrapped.encode(TEXT[:200], add_special_tokens=False) == tok.encode(TEXT[:200])
    assert (wrapped.eos_token_id, wrapped.pad_token_id, wrapped.bos_token_id) == (tok.eos_id, tok.pad_id, tok.bos_id)
    export_tokenizer(tok, tmp_path / "export")
    again = load_tokenizer(tmp_path / "export")
    messages = _messages(True, 1)
    assert again.apply_chat_template(messages) == tok.apply_chat_template(messages)
    assert again.encode(TEXT[:200]) == tok.encode(TEXT[:200])


def test_prepare_data_tokenizer_option_names_the_data_tokenizer(folder):
    """`prepare_data.py data=english_docs tokenizer=<folder>`: the short spelling of data.tokenizer.path."""
    from hydra import compose, initialize_config_dir

    from anchormass.commands.prepare_data import check_data_config
    from anchormass.utils import CONFIG_ROOT

    with initialize_config_dir(config_dir=str(CONFIG_ROOT), version_base="1.3"):
        cfg = compose("prepare_data", overrides=["data=english_docs", f"tokenizer={folder}"])
        bare = compose("prepare_data", overrides=["data=english_docs"])
    check_data_config(cfg)
    assert cfg.data.tokenizer.path == str(folder)
    with pytest.raises(ConfigError, match="data.tokenizer.path is required"):
        check_data_config(bare)
