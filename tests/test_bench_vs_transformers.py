"""scripts/bench_hf.py's library (anchormass/bench/vs_transformers.py): our Standard, transformers'
Llama on the same weights and AnchorMass made from them, timed on the same prompts. The test checks
what the comparison may claim (both paths pick the same first token; the floor adds the cache to the
weights; AnchorMass's cache stops growing), not any speed."""

import pytest
import torch
from _gqa_helpers import gqa_config

from anchormass.bench import vs_transformers
from anchormass.eval.suites.kv_frontier.variants import Variant, build_variant, chosen_groups
from anchormass.models import build_model

pytest.importorskip("transformers")


def test_the_comparison_runs_every_path_on_one_prompt_and_charges_weights_plus_cache():
    from anchormass.hf.export_llama import llama_from_ours

    torch.manual_seed(0)
    std = build_model(gqa_config("standard", vocab_size=300)).eval()
    cfg = std.cfg
    am = build_variant(std, Variant(1, "index", 8, True), chosen_groups(torch.zeros(cfg.n_layers, cfg.kv_heads),
                                                                          1, "index"))
    hf = llama_from_ours(std, {"bos": 1, "eos": 2, "pad": 0, "unk": 0})
    seen = []
    res = vs_transformers.compare(std, hf, am, [128, 512], repeats=1, decode_tokens=2, on_length=seen.append)
    assert [r["length"] for r in res["rows"]] == [128, 512] and len(seen) == 2
    for r in res["rows"]:
        assert r["same_first_token"]
        assert r["floor_ms_per_token"]["standard"] > 1e3 * res["weight_bytes"] / res["bandwidth_bytes_per_s"]
    std_cache = [r["cache_bytes"]["standard"] for r in res["rows"]]
    am_cache = [r["cache_bytes"]["anchormass"] for r in res["rows"]]
    assert std_cache[1] / std_cache[0] == pytest.approx((512 + 2) / (128 + 2))  # prompt + decoded tokens
    assert am_cache[1] < std_cache[1]
    assert res["weight_bytes"] == sum(p.numel() * 4 for p in std.parameters())  # tied head counted once
    text = vs_transformers.report(res)
    assert "| 512" in text and "Decode time per token" in text


def test_the_training_step_comparison_scores_the_same_loss_as_transformers():
    from anchormass.hf.export_llama import llama_from_ours

    torch.manual_seed(0)
    std = build_model(gqa_config("standard", vocab_size=300))
    hf = llama_from_ours(std, {"bos": 1, "eos": 2, "pad": 0, "unk": 0}).train()
    res = vs_transformers.train_steps(std, hf, 96, repeats=1)
    assert set(res["steps_s"]) == {"ours", "transformers", "ours_bf16_autocast"}
    assert abs(res["loss"]["ours"] - res["loss"]["transformers"]) < 1e-4
    assert abs(res["loss"]["ours_bf16_autocast"] - res["loss"]["ours"]) < 0.05
    assert all(p.grad is None for p in std.parameters())  # each step leaves no gradients behind
    text = vs_transformers.report({**_tiny_result(std, hf), "train": res})
    assert "Training step" in text


def _tiny_result(std, hf):
    am = build_variant(std, Variant(1, "index", 8, True), chosen_groups(torch.zeros(std.cfg.n_layers,
                                                                                   std.cfg.kv_heads), 1, "index"))
    return vs_transformers.compare(std.eval(), hf.eval(), am, [64], repeats=1, decode_tokens=1)


def test_the_retrofit_steps_are_timed_beside_them_and_report_without_the_comparison():
    """With an AnchorMass model: its end-to-end LM step (the same loss as the Standard's up to the
    compression) and the attention-transfer step (positive: the compression changes the attention
    past one block); the report renders a training-only result (compare=false)."""
    from anchormass.hf.export_llama import llama_from_ours

    torch.manual_seed(0)
    std = build_model(gqa_config("standard", vocab_size=300))
    am = build_variant(std, Variant(1, "index", 8, True), chosen_groups(torch.zeros(std.cfg.n_layers,
                                                                                   std.cfg.kv_heads), 1, "index"))
    hf = llama_from_ours(std, {"bos": 1, "eos": 2, "pad": 0, "unk": 0}).train()
    res = vs_transformers.train_steps(std, hf, 192, repeats=1, anchormass=am.train())
    assert {"anchormass_lm", "attention_transfer", "attention_transfer_bf16_autocast"} <= set(res["steps_s"])
    assert res["loss"]["attention_transfer"] > 0 and res["loss"]["anchormass_lm"] != res["loss"]["ours"]
    assert all(p.grad is None for p in am.parameters())
    text = vs_transformers.report({"rows": [], "train": res})
    assert text.startswith("Training step") and "attention_transfer" in text
