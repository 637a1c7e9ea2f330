"""Hugging Face export: Standard -> native Llama, AnchorMass -> trust_remote_code; same logits,
same greedy tokens as our engine (full cache and tight budgets), command-line errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from _gqa_helpers import GQA  # noqa: E402

from anchormass.errors import CheckpointError, ConfigError  # noqa: E402
from anchormass.hf.export import export_checkpoint  # noqa: E402
from anchormass.hf.provenance import PROVENANCE_FILE  # noqa: E402
from anchormass.inference.generate import generate  # noqa: E402
from anchormass.own_files import STAGING_MARK  # noqa: E402
from anchormass.training.checkpoint import load_model  # noqa: E402
from anchormass.utils import sha256_file  # noqa: E402

from _hf_helpers import VOCAB, tiny_checkpoint, tiny_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRAINED = 256  # original_max_len of the test checkpoints


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """{name: (checkpoint, export folder)} for standard_tiny and anchormass_tiny, and both with
    grouped-query attention and tied embeddings (<preset>_gqa, tests/_gqa_helpers.py); anchormass_tiny
    with a learned outlier scorer (anchormass_tiny_learned: the folder carries the scorer's tensors)."""
    base = tmp_path_factory.mktemp("hf_export")
    tok = tiny_tokenizer(base)
    gqa = {k: v for k, v in GQA.items() if k != "vocab_size"}
    out = {}
    for preset, std in (("standard_tiny", 0.02), ("anchormass_tiny", 0.2)):
        for name, changes in ((preset, {}), (f"{preset}_gqa", gqa)):
            ckpt = tiny_checkpoint(base / f"{name}.ckpt", preset, tok, init_std=std, original_max_len=TRAINED,
                                   **changes)
            out[name] = (ckpt, export_checkpoint(ckpt, base / f"{name}_hf"))
    ckpt = tiny_checkpoint(base / "learned.ckpt", "anchormass_tiny", tok, init_std=0.2, original_max_len=TRAINED,
                           outlier_scorer="learned")
    out["anchormass_tiny_learned"] = (ckpt, export_checkpoint(ckpt, base / "anchormass_tiny_learned_hf"))
    return out


def _ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(4, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _stored_names(folder: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return list(f.keys())


@pytest.mark.parametrize("name", ["standard_tiny", "standard_tiny_gqa"])
def test_standard_exports_as_native_llama(exported, name):
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    ckpt, folder = exported[name]
    assert not list(folder.glob("*.py"))  # no custom code
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama"
    hf = AutoModelForCausalLM.from_pretrained(folder)
    assert type(hf) is LlamaForCausalLM
    ours, _ = load_model(ckpt)
    assert sum(p.numel() for p in hf.parameters()) == sum(p.numel() for p in ours.parameters())
    tied = ours.cfg.tie_embeddings  # gqa: 8 query heads over 4 KV heads, the LM head stored once
    assert (config["num_key_value_heads"], config["tie_word_embeddings"]) == (ours.cfg.kv_heads, tied)
    assert ("lm_head.weight" in _stored_names(folder)) is not tied
    ids = _ids(2, TRAINED)  # the whole trained length: RoPE conventions would diverge with position
    with torch.no_grad():
        diff = (hf(ids).logits - ours(ids)).abs().max().item()
    assert diff <= 1e-4
    info = json.loads((folder / PROVENANCE_FILE).read_text())
    assert info["source_sha256"] == sha256_file(ckpt) and info["git_commit"] and info["format"] == "llama"


def test_swapped_rope_halves_would_be_caught(exported):
    """The logit check above can fail: q/k rows in the interleaved RoPE layout give other logits."""
    from transformers import AutoModelForCausalLM

    _, folder = exported["standard_tiny"]
    hf = AutoModelForCausalLM.from_pretrained(folder)
    ids = _ids(1, 64)
    with torch.no_grad():
        ref = hf(ids).logits
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                w = proj.weight.view(hf.config.num_attention_heads, hf.config.head_dim, -1)
                perm = torch.arange(hf.config.head_dim).view(2, -1).t().reshape(-1)  # interleave the halves
                proj.weight.copy_(w[:, perm].reshape_as(proj.weight))
        assert (hf(ids).logits - ref).abs().max().item() > 1e-3


def test_another_kv_head_sharing_would_be_caught(exported):
    """The GQA logit check can fail: had query head h read KV head h % n_kv_heads (tiling instead of
    Llama's h // (n_heads / n_kv_heads)), the export would need its query heads reordered."""
    from transformers import AutoModelForCausalLM

    ckpt, folder = exported["standard_tiny_gqa"]
    hf, (ours, _) = AutoModelForCausalLM.from_pretrained(folder), load_model(ckpt)
    ids = _ids(1, 64)
    tiled = torch.arange(8).view(2, 4).t().reshape(-1)  # group of KV head j = query heads j and j + 4
    with torch.no_grad():
        for layer in hf.model.layers:
            q, o = layer.self_attn.q_proj, layer.self_attn.o_proj
            q.weight.copy_(q.weight.view(8, 16, -1)[tiled].reshape_as(q.weight))
            o.weight.copy_(o.weight.view(-1, 8, 16)[:, tiled].reshape_as(o.weight))
        assert (hf(ids).logits - ours(ids)).abs().max().item() > 1e-3


@pytest.mark.parametrize("name", ["anchormass_tiny", "anchormass_tiny_gqa", "anchormass_tiny_learned"])
def test_anchormass_loads_with_remote_code_and_matches(exported, name):
    from transformers import AutoModelForCausalLM

    ckpt, folder = exported[name]
    hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    ours, _ = load_model(ckpt)
    assert sum(p.numel() for p in hf.parameters()) == sum(p.numel() for p in ours.parameters())
    assert (hf.model.lm_head.weight is hf.model.embed.weight) is ours.cfg.tie_embeddings
    assert ("model.lm_head.weight" in _stored_names(folder)) is not ours.cfg.tie_embeddings
    ids = _ids(2, TRAINED)
    with torch.no_grad():
        assert (hf(ids).logits - ours(ids)).abs().max().item() <= 1e-4
        # Through the session cache too (chunk path, every position's logits).
        cached = hf(ids, use_cache=True)
        assert cached.cache.get_seq_length() == TRAINED
        assert (cached.logits - ours(ids)).abs().max().item() <= 1e-4
    info = json.loads((folder / PROVENANCE_FILE).read_text())
    assert info["source_sha256"] == sha256_file(ckpt) and info["format"] == "anchormass"


@pytest.mark.parametrize("policy,budget", [(None, None), ("adaptive", 8), ("fifo", 8)])
def test_generate_greedy_equals_our_generate(exported, policy, budget):
    from transformers import AutoModelForCausalLM

    from anchormass.hf.cache_adapter import AnchorMassHFCache

    ckpt, folder = exported["anchormass_tiny"]
    hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    ours, _ = load_model(ckpt)
    ids = _ids(2, 200, seed=1)  # 200 tokens: three compressed blocks, so a budget of 8 slots binds
    want = generate(ours, ids, 16, policy=policy, budget=budget, eos_id=None)
    cache = AnchorMassHFCache(ours.cfg.n_layers, policy, budget)
    got = hf.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=None, cache=cache)[:, ids.shape[1]:]
    assert torch.equal(got, want)
    if budget is not None:
        assert max(max(per_seq) for per_seq in cache.session.stats()["slots"]) <= budget
        full = generate(ours, ids, 16, eos_id=None)
        assert not torch.equal(full, want)  # the budget really changed the computation


def test_generate_policy_from_generation_config_and_sampling(exported):
    from transformers import AutoModelForCausalLM, GenerationConfig

    ckpt, folder = exported["anchormass_tiny"]
    hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    ours, _ = load_model(ckpt)
    ids = _ids(3, 200, seed=2)
    greedy = GenerationConfig(max_new_tokens=12, do_sample=False, slot_policy="fifo", slot_budget=8)
    got = hf.generate(ids, generation_config=greedy)[:, ids.shape[1]:]
    assert torch.equal(got, generate(ours, ids, 12, policy="fifo", budget=8, eos_id=None))
    sampling = GenerationConfig(max_new_tokens=12, do_sample=True, temperature=0.9, top_k=50,
                                slot_policy="adaptive", slot_budget=8)
    torch.manual_seed(0)
    a = hf.generate(ids, generation_config=sampling)
    torch.manual_seed(0)
    b = hf.generate(ids, generation_config=sampling)
    assert a.shape == (3, 212) and torch.equal(a, b) and int(a.max()) < VOCAB


def test_padded_batches_and_beam_search_are_refused(exported):
    from transformers import AutoModelForCausalLM

    _, folder = exported["anchormass_tiny"]
    hf = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    ids = _ids(2, 20)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with pytest.raises(ValueError, match="padded"):
        hf.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False)
    with pytest.raises(ValueError, match="beam"):
        hf.generate(ids, max_new_tokens=2, num_beams=2, do_sample=False)


def test_exports_hold_their_weights_as_safetensors_only(exported, tmp_path):
    from anchormass.hf.export import check_safetensors_only

    for _, folder in exported.values():
        assert list(folder.glob("*.safetensors")) and not list(folder.glob("*.bin"))
        check_safetensors_only(folder)
    pickled = tmp_path / "pickled"
    shutil.copytree(exported["standard_tiny"][1], pickled)
    torch.save({}, pickled / "pytorch_model.bin")  # what save_pretrained(safe_serialization=False) writes
    with pytest.raises(CheckpointError, match=r"safetensors only, found \['pytorch_model.bin'\]"):
        check_safetensors_only(pickled)


def test_export_removes_only_a_staging_folder_of_its_own(exported, tmp_path):
    """A `.<out>.partial` left by a killed export goes; one that is not ours is refused, untouched."""
    ckpt, _ = exported["standard_tiny"]
    staging = tmp_path / ".a.partial"
    staging.mkdir()
    (staging / "draft.md").write_text("a user's\n")
    with pytest.raises(ConfigError, match=r"\.a\.partial is in the way of out=.* not a staging folder of ours"):
        export_checkpoint(ckpt, tmp_path / "a")
    assert (staging / "draft.md").is_file()
    (staging / "draft.md").unlink()
    (staging / STAGING_MARK).write_bytes(b"")
    (staging / "config.json").write_text("{half")
    export_checkpoint(ckpt, tmp_path / "a")
    assert not staging.exists() and STAGING_MARK not in {p.name for p in (tmp_path / "a").iterdir()}
    assert json.loads((tmp_path / "a" / "config.json").read_text())


def test_export_refuses_bad_input(exported, tmp_path):
    ckpt, folder = exported["standard_tiny"]
    with pytest.raises(CheckpointError, match="not found"):
        export_checkpoint(tmp_path / "missing.ckpt", tmp_path / "a")
    (tmp_path / "bad.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot read"):
        export_checkpoint(tmp_path / "bad.ckpt", tmp_path / "b")
    with pytest.raises(ConfigError, match="format=llama"):
        export_checkpoint(exported["anchormass_tiny"][0], tmp_path / "c", format="llama")
    assert not (tmp_path / "b").exists() and not list(tmp_path.glob(".*partial"))


def test_cli_one_line_error_for_non_empty_out(exported):
    ckpt, folder = exported["standard_tiny"]
    r = subprocess.run([sys.executable, str(ROOT / "scripts/export_hf.py"), f"ckpt={ckpt}", f"out={folder}"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "not empty" in r.stderr


def test_loading_without_the_package_names_its_install_command(exported):
    """transformers would say `pip install anchormass` (a PyPI name that is not this project); the
    exported file names where its code comes from instead."""
    from anchormass.hf.export_anchormass import install_command

    _, folder = exported["anchormass_tiny"]
    load = f"""
import importlib.abc, sys
class NoAnchorMass(importlib.abc.MetaPathFinder):  # as if the package were not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "anchormass":
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, NoAnchorMass())
from transformers import AutoModelForCausalLM
AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True)
"""
    r = subprocess.run([sys.executable, "-c", load], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError:") and install_command() in last and "pip install anchormass`" not in last


def test_an_export_has_one_file_mode_and_pads_on_the_left(exported):
    """safetensors writes through a private 0600 temp file; the published folder has the umask's mode
    throughout, and its tokenizer pads before the prompt (generation follows the prompt)."""
    from transformers import AutoTokenizer

    from anchormass.utils import current_umask

    _, folder = exported["standard_tiny"]
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir() if p.is_file()}
    assert set(modes.values()) == {0o666 & ~current_umask()}, modes
    assert AutoTokenizer.from_pretrained(folder).padding_side == "left"


def test_a_llama_exported_for_one_prompt_length_is_our_ntk_session_there(exported):
    """Past the trained length our session fixes RoPE's base from the prompt's length; the Llama exported
    for that length (plain RoPE with that base) gives the same logits and the same greedy tokens, and
    the default export (the trained base) does not: kv_frontier runs kvpress on it under NTK."""
    from anchormass.hf.export_llama import llama_from_ours

    ours, _ = load_model(exported["standard_tiny_gqa"][0])
    ours.eval()
    length = TRAINED + 64
    ids = _ids(1, length, seed=4)
    with torch.no_grad():
        want = ours(ids)  # a fresh forward over `length` tokens: the NTK base of that length
        trained = (llama_from_ours(ours, {"bos": 1, "eos": 2, "pad": 0})(ids).logits - want).abs().max().item()
        hf = llama_from_ours(ours, {"bos": 1, "eos": 2, "pad": 0}, session_len=length)
        same = (hf(ids).logits - want).abs().max().item()
        assert same <= 1e-5 and trained > 100 * same  # the trained base is another model here
        theirs = hf.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(theirs[:, length:], generate(ours, ids, max_new_tokens=12))
