import numpy as np
import pytest

from anchormass.errors import ConfigError
from anchormass.eval.items import PHRASINGS, Haystack, first_digit_run, make_trial, score_answer, trial_grid


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


def test_needle_jitter_gives_every_trial_of_a_length_its_own_alignment():
    tok = CharTokenizer()
    plain = Haystack(tok, filler="classic_en", lang="en")
    jittered = Haystack(tok, filler="classic_en", lang="en", jitter=64)
    depths, seeds = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0], [0, 1, 2]
    starts = []
    for t, t0 in zip(trial_grid([700], depths, seeds, jitter=64), trial_grid([700], depths, seeds)):
        ids, (start, end) = jittered.build(t), jittered.needle_span(t)
        assert len(ids) == 700 and ids[start:end] == tok.encode(PHRASINGS["en"]["plain"][1].format(key=t.key))
        assert abs(start - plain.needle_span(t0)[0]) < 64  # still near its depth
        assert plain.build(t) == plain.build(t0)  # without the option a trial lands where it always did
        starts.append(start)
    assert len({s % 64 for s in starts}) == len(starts) == 21  # no two share an alignment to 64-token blocks
    with pytest.raises(ConfigError, match="needle_jitter"):
        trial_grid([700], depths * 4, seeds, jitter=64)  # 84 trials cannot have 84 offsets in 64 positions
