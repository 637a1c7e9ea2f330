import numpy as np
import pytest

from anchormass.eval.report import holm, mcnemar_exact, mcnemar_p, paired_nll_by_length, wilcoxon_signed_rank

LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768]


def _diffs(loss_rank=None):
    # |d| ranks 1..10; B wins (d > 0) everywhere except at |d|-rank `loss_rank`.
    d = np.arange(1, 11) * 0.01
    if loss_rank is not None:
        d[loss_rank - 1] *= -1
    return d


def test_all_wins_at_six_lengths_gives_6_over_512():
    b = {L: [3.0] * 10 for L in LENGTHS}
    a = {L: list(3.0 + _diffs()) for L in LENGTHS}
    rows = paired_nll_by_length(a, b)
    for L in LENGTHS:
        assert rows[L]["wins_b"] == 10
        assert rows[L]["p_wilcoxon"] == pytest.approx(1 / 512)
        assert rows[L]["p_holm"] == pytest.approx(6 / 512)  # 0.01171875


def test_one_loss_at_rank_4_in_least_significant_row_gives_7_over_512():
    b = {L: [3.0] * 10 for L in LENGTHS}
    a = {L: list(3.0 + _diffs(loss_rank=4 if L == 4096 else None)) for L in LENGTHS}
    rows = paired_nll_by_length(a, b)
    assert rows[4096]["wins_b"] == 9
    assert rows[4096]["p_wilcoxon"] == pytest.approx(14 / 1024)
    assert rows[4096]["p_holm"] == pytest.approx(7 / 512)  # the write-up's 0.0137
    for L in LENGTHS:
        if L != 4096:
            assert rows[L]["p_holm"] == pytest.approx(6 / 512)


def test_wilcoxon_is_symmetric_and_handles_zeros():
    d = _diffs(loss_rank=2)
    assert wilcoxon_signed_rank(d)[0] == pytest.approx(wilcoxon_signed_rank(-d)[0])
    assert wilcoxon_signed_rank([0.0, 0.0])[0] == 1.0


def test_holm_keeps_input_order_and_is_monotone():
    adj = holm([0.04, 0.01, 0.03])
    assert adj == pytest.approx([0.06, 0.03, 0.06])


def test_mcnemar_known_value():
    assert mcnemar_p(30, 15) == pytest.approx(0.035698, abs=5e-7)
    a = [True] * 30 + [False] * 15 + [True] * 5
    b = [False] * 30 + [True] * 15 + [True] * 5
    res = mcnemar_exact(a, b)
    assert (res["b"], res["c"]) == (30, 15)
    assert res["p"] == pytest.approx(0.035698, abs=5e-7)
    assert mcnemar_p(0, 0) == 1.0


def _brute_force_sign_flip_p(d):
    """Two-sided p of W+ over every one of the 2^n sign assignments, midranks for ties."""
    import itertools

    from scipy.stats import rankdata

    d = np.asarray([x for x in d if x != 0], dtype=float)
    r = rankdata(np.abs(d))
    mean, obs = r.sum() / 2, r[d > 0].sum()
    flips = list(itertools.product([0.0, 1.0], repeat=d.size))
    return sum(abs(r @ np.array(s) - mean) >= abs(obs - mean) - 1e-9 for s in flips) / len(flips)


@pytest.mark.parametrize("d", [[1, 1, 2, 2, 2, -3, 4, 4, 5, -1], [0.5, 0.5, -0.5, 0.25, 0.25, 0.75, 0.75, 1.0, 0]])
def test_wilcoxon_with_tied_differences_is_the_exact_permutation_p(d):
    p, method = wilcoxon_signed_rank(d)
    assert method == "permutation"
    assert p == pytest.approx(_brute_force_sign_flip_p(d), abs=1e-12)


def test_wilcoxon_without_ties_stays_scipy_exact_and_rows_say_which_method():
    d = _diffs(loss_rank=4)
    p, method = wilcoxon_signed_rank(d)
    assert method == "exact" and p == pytest.approx(_brute_force_sign_flip_p(d), abs=1e-12)
    rows = paired_nll_by_length({1: [3.0] * 4 + [3.1] * 6, 2: list(3.0 + d)}, {1: [3.05] * 10, 2: [3.0] * 10})
    assert rows[1]["wilcoxon_method"] == "permutation" and rows[2]["wilcoxon_method"] == "exact"
    assert rows[1]["holm_m"] == rows[2]["holm_m"] == 2
