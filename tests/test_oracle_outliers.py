"""The evaluation-only oracle of stage 1 (docs/method.md §6 k): a group holding a marked token emits
that token, exactly, as its outlier slot; the cache finds the marks by absolute position whatever
the prefill chunks and decode steps, and an unmarked run is the write-up's rule unchanged."""

import torch
from _gqa_helpers import gqa_config

from anchormass.cache import new_cache
from anchormass.inference import generate
from anchormass.models import build_model
from anchormass.models.compression import compress_blocks


def test_a_marked_token_becomes_its_groups_outlier_exactly():
    cfg = gqa_config("anchormass").replace(block_size=16, group_size=8)
    torch.manual_seed(0)
    k, v = torch.randn(2, 2, 32, 16), torch.randn(2, 2, 32, 16)
    forced = torch.zeros(2, 32, dtype=torch.bool)
    forced[0, 5] = forced[0, 6] = forced[1, 30] = True  # groups 0 (first mark wins) and 3
    slot_k, slot_v, mass = compress_blocks(k, v, cfg, forced=forced)
    assert torch.equal(slot_k[0, :, 1], k[0, :, 5]) and torch.equal(slot_v[0, :, 1], v[0, :, 5])
    assert torch.equal(slot_v[1, :, 7], v[1, :, 30]) and mass[0, 1] == 1 and mass[1, 7] == 1
    assert mass[0, 0] == 7  # the rest of the group is its background
    plain = compress_blocks(k, v, cfg)
    untouched = torch.ones(2, 8, dtype=torch.bool)
    untouched[0, 0:2] = untouched[1, 6:8] = False  # group 0 of row 0 and group 3 of row 1 (2 slots each)
    assert torch.equal(plain[2][untouched], mass[untouched])


def _answer(model, ids, chunk, forced):
    cache = new_cache(model, batch_size=ids.shape[0])
    if forced is not None:
        cache.force_outliers(forced)
    logits = generate.prefill(model, ids, cache, chunk).float()
    out = generate.decode(model, cache, logits, 40)  # decoding completes more blocks
    return out, cache.stored_nbytes, logits


def test_the_cache_finds_the_marks_by_position_whatever_the_chunks():
    torch.manual_seed(0)
    cfg = gqa_config("anchormass").replace(n_sinks=4, block_size=16, window=16, group_size=8)
    model = build_model(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 150))
    forced = torch.zeros(2, 150, dtype=torch.bool)
    forced[0, [20, 21, 77, 149]] = True
    forced[1, [5, 64, 100]] = True
    with torch.no_grad():
        runs = [_answer(model, ids, chunk, forced) for chunk in (150, 37, 16, 1)]
        plain = _answer(model, ids, 150, None)
    for out, stored, logits in runs[1:]:
        assert torch.equal(out, runs[0][0]) and stored == runs[0][1]
        torch.testing.assert_close(logits, runs[0][2], atol=1e-4, rtol=0)
    # (a random model's rule emits in every group, so the oracle changes which token, not how many)
    assert (runs[0][2] - plain[2]).abs().max() > 1e-3
