"""The goodness-of-fit statistic the sampling tests share (``tests/sampling_stats.py``)."""

from __future__ import annotations

import numpy as np
from sampling_stats import categorical_fit_pvalue, chi_square_pvalue

P_MIN = 1e-5  # the sampling tests' bar


def rare_repeats(seen: int, n: int = 1024, mass: float = 0.433) -> tuple[np.ndarray, np.ndarray]:
    """``n`` draws, each repeating its previous token with probability ``mass / n``; ``seen``
    of them do."""
    expected = np.tile([mass / n, 1.0 - mass / n], (n, 1))
    return expected, np.array([0] * seen + [1] * (n - seen))


def test_a_category_expected_less_than_once_gets_its_poisson_tail():
    expected, observed = rare_repeats(4)
    # Four where 0.43 are expected happens about once in a thousand runs; chi-square calls
    # it 6e-8, which failed a correct sampler once.
    assert chi_square_pvalue(expected, np.bincount(observed, minlength=2)) < P_MIN
    assert 5e-4 < categorical_fit_pvalue(expected, observed) < 5e-3
    assert categorical_fit_pvalue(*rare_repeats(0)) == 1.0


def test_a_biased_rare_category_still_fails_by_a_wide_margin():
    assert categorical_fit_pvalue(*rare_repeats(40)) < 1e-30


def test_dense_categories_keep_chi_square_and_a_biased_die_fails():
    rng = np.random.default_rng(0)
    fair = np.full((6000, 6), 1 / 6)
    assert categorical_fit_pvalue(fair, rng.integers(0, 6, 6000)) > 1e-3
    loaded = rng.choice(6, 6000, p=[0.2, 0.16, 0.16, 0.16, 0.16, 0.16])
    assert categorical_fit_pvalue(fair, loaded) < 1e-8


def test_a_sparse_pool_beside_dense_categories_is_tested_both_ways():
    n = 2000
    expected = np.tile([0.5, 0.4985, 0.001, 0.0005], (n, 1))  # the last two: 3 expected
    fine = np.array([0] * 1000 + [1] * 996 + [2] * 3 + [3])
    assert categorical_fit_pvalue(expected, fine) > 1e-2
    too_many_rare = np.array([0] * 990 + [1] * 980 + [2] * 30)
    assert categorical_fit_pvalue(expected, too_many_rare) < 1e-12
    skewed = np.array([0] * 1200 + [1] * 797 + [2] * 3)
    assert categorical_fit_pvalue(expected, skewed) < 1e-12
