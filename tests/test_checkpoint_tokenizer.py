"""A checkpoint carries its tokenizer (training/checkpoint_tokenizer.py): evaluation and export find
it from any folder once the prepared data is gone, whichever kind it is (SentencePiece or an
imported Hugging Face folder); a checkpoint from before names a path only, relative to the folder it
was trained in, which is looked for above the checkpoint and otherwise refused in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from anchormass.data.tokenizer_loader import load_tokenizer
from anchormass.errors import DataError
from anchormass.eval.loading import tokenizer_path
from anchormass.eval.suite import EvalModel
from anchormass.training.checkpoint import load_model
from anchormass.training.checkpoint_tokenizer import carried, checkpoint_tokenizer

from _hf_helpers import tiny_checkpoint, tiny_tokenizer
from test_data_hf_tokenizer import make_folder


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory) -> Path:
    return tiny_tokenizer(tmp_path_factory.mktemp("sp"))


def checkpoint_in_run(project: Path, tokenizer: Path, named: str, carry: bool) -> Path:
    """<project>/runs/r/checkpoints/last.ckpt of a Standard tiny model trained on `tokenizer`
    (recorded as `named`), carrying its files or not (a checkpoint from before)."""
    tok = load_tokenizer(tokenizer)
    path = tiny_checkpoint(project / "runs" / "r" / "checkpoints" / "last.ckpt", "standard_tiny", tokenizer)
    import torch

    ckpt = torch.load(path, weights_only=True)
    ckpt["hyper_parameters"].update(tokenizer_path=named, tokenizer_checksum=tok.checksum,
                                    tokenizer_files=carried(tok) if carry else None)
    from anchormass.training.checkpoint import atomic_torch_save

    atomic_torch_save(ckpt, path)
    return path


def evaluated_tokenizer(ckpt: Path) -> Path:
    model, hparams = load_model(ckpt)
    return tokenizer_path({}, [EvalModel(label="a", model=model, config=model.cfg, source=str(ckpt.resolve()),
                                         hparams=hparams)])


@pytest.mark.parametrize("kind", ["sentencepiece", "huggingface"])
def test_a_carried_tokenizer_needs_no_data_folder(tmp_path, monkeypatch, sentencepiece, kind):
    from anchormass.hf.export import load_source

    data = tmp_path / "project" / "data" / "demo"
    data.mkdir(parents=True)
    if kind == "sentencepiece":
        tokenizer = Path(shutil.copy(sentencepiece, data / "tokenizer.model"))
    else:
        tokenizer = make_folder(data / "tokenizer")
    want = load_tokenizer(tokenizer).checksum
    ckpt = checkpoint_in_run(tmp_path / "project", tokenizer, str(tokenizer), carry=True)
    assert evaluated_tokenizer(ckpt) == tokenizer  # the data's own copy while it is there
    shutil.rmtree(tmp_path / "project" / "data")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("ANCHORMASS_CACHE", str(tmp_path / "cache"))
    found = evaluated_tokenizer(ckpt)
    assert found.is_relative_to(tmp_path / "cache") and want[:16] in str(found)
    assert load_tokenizer(found).checksum == want
    assert load_source(ckpt)[2].checksum == want  # the export's tokenizer too


def test_an_old_relative_path_is_found_above_the_checkpoint_or_refused(tmp_path, monkeypatch, sentencepiece):
    project = tmp_path / "project"
    (project / "data" / "demo").mkdir(parents=True)
    shutil.copy(sentencepiece, project / "data" / "demo" / "tokenizer.model")
    ckpt = checkpoint_in_run(project, sentencepiece, "data/demo/tokenizer.model", carry=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert evaluated_tokenizer(ckpt) == project / "data" / "demo" / "tokenizer.model"
    shutil.rmtree(project / "data")
    with pytest.raises(DataError) as err:
        checkpoint_tokenizer(load_model(ckpt)[1], ckpt)
    assert "data/demo/tokenizer.model" in str(err.value) and "pass tokenizer=" in str(err.value)
    assert "\n" not in str(err.value)
