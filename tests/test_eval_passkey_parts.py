import numpy as np
import pytest

from anchormass.errors import ConfigError
from anchormass.eval.items import (
    ALIGN_BLOCK,
    DEFAULT_DEPTHS,
    PHRASINGS,
    Haystack,
    first_digit_run,
    make_trial,
    score_answer,
    trial_grid,
)


@pytest.mark.parametrize(
    "text, key, exact, digits, answer",
    [
        ("4821です。", "4821", True, 4, "4821"),
        ("パスキーは４８２１です", "4821", True, 4, "4821"),  # full-width digits: NFKC
        (" 4827 and 4821", "4821", False, 3, "4827"),  # only the first run counts
        ("48213", "4821", False, 4, "48213"),  # longer run: not exact, 4 digits match
        ("1821", "4821", False, 3, "1821"),
        ("no digits", "4821", False, 0, None),
        ("8214", "4821", False, 0, "8214"),
        ("48", "4821", False, 2, "48"),
    ],
)
def test_score_answer(text, key, exact, digits, answer):
    res = score_answer(text, key)
    assert (res["exact"], res["digits"], res["answer"]) == (exact, digits, answer)


def test_first_digit_run_nfkc_superscripts_and_none():
    assert first_digit_run("値は①と5") == "1"  # NFKC maps the circled one to '1'
    assert first_digit_run("") is None


class CharTokenizer:
    """One id per character: lengths are easy to reason about."""

    bos_id = 2

    def encode(self, text):
        return [10 + (ord(c) % 5000) for c in text]


@pytest.mark.parametrize("filler", ["classic_en", "classic_ja"])
@pytest.mark.parametrize("length", [200, 257, 1000])
def test_filler_hits_exact_lengths_and_places_needle(filler, length):
    tok = CharTokenizer()
    hay = Haystack(tok, filler=filler, lang="ja")
    for depth in (0.0, 0.5, 1.0):
        trial = make_trial(length, depth, seed=3)
        ids = hay.build(trial)
        assert len(ids) == length
        start, end = hay.needle_span(trial)
        needle = tok.encode(PHRASINGS["ja"]["plain"][1].format(key=trial.key))
        assert ids[start:end] == needle
        fill = length - hay.fixed_tokens(trial)
        assert start == round(depth * fill)


@pytest.mark.parametrize("length", [1024, 2048])
def test_jittered_needles_sit_at_distinct_block_offsets_near_their_depth(length):
    """15 trials of a length (5 depths x 3 seeds): no two share the needle's offset inside the
    64-token block, each needle is where needle_span says and within one block of its depth."""
    tok = CharTokenizer()
    hay = Haystack(tok, filler="classic_en", lang="en")
    trials = trial_grid([length], DEFAULT_DEPTHS, [0, 1, 2])
    starts = []
    for t in trials:
        ids, (start, end) = hay.build(t), hay.needle_span(t)
        assert len(ids) == length and ids[start:end] == tok.encode(PHRASINGS["en"]["plain"][1].format(key=t.key))
        assert abs(start - round(t.depth * (length - hay.fixed_tokens(t)))) < ALIGN_BLOCK
        starts.append(start % ALIGN_BLOCK)
    assert len(trials) == 15 and len(set(starts)) == 15
    plain = trial_grid([length], DEFAULT_DEPTHS, [0, 1, 2], jitter=False)  # the old layout: one offset per depth
    assert len({hay.needle_span(t)[0] % ALIGN_BLOCK for t in plain}) <= len(DEFAULT_DEPTHS)


def test_token_file_filler_is_deterministic_and_exact():
    tok = CharTokenizer()
    stream = np.arange(100, 5100, dtype=np.uint16)
    hay = Haystack(tok, filler="tokens", lang="en", tokens=stream)
    trial = make_trial(300, 0.3, seed=1, phrasing="dialogue")
    a, b = hay.build(trial), hay.build(trial)
    assert a == b and len(a) == 300
    other = hay.build(make_trial(300, 0.3, seed=2, phrasing="dialogue"))
    assert other != a  # a different seed reads another window


def test_trials_are_identical_across_calls_and_keys_are_4_digits():
    t1, t2 = make_trial(4096, 0.1, 0), make_trial(4096, 0.1, 0)
    assert t1 == t2 and len(t1.key) == 4 and t1.key.isdigit()
    assert len({make_trial(4096, d, s).key for d in (0.1, 0.3, 0.5) for s in range(3)}) > 1


def test_too_short_and_bad_phrasing_are_config_errors():
    hay = Haystack(CharTokenizer(), filler="classic_ja")
    with pytest.raises(ConfigError, match="shorter"):
        hay.build(make_trial(10, 0.5, 0))
    with pytest.raises(ConfigError, match="phrasing"):
        hay.build(make_trial(500, 0.5, 0, phrasing="haiku"))
    with pytest.raises(ConfigError, match="filler"):
        Haystack(CharTokenizer(), filler="lorem")
