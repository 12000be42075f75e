"""Paired tests over notes: Wilcoxon signed-rank, sign test, one-sample t (App. C, App. K).

- Task and fidelity differences: two-sided Wilcoxon signed-rank with zero differences
  dropped, beside a percentile bootstrap interval of the mean difference (App. K).
- Set comparisons and mechanism readouts: two-sided sign tests; the win counts are
  the paper's "notes" counts (App. C, App. K).
- Per-head p-values: a one-sample t-test across the per-note means (App. C); these
  feed Benjamini-Hochberg (`mistill.stats.multiple`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats

from mistill.stats.bootstrap import Interval, paired_bootstrap_mean_difference
from mistill.stats.checks import as_pair, as_values


@dataclass(frozen=True)
class SignTest:
    """Two-sided exact sign test; zero differences are dropped and counted apart."""

    n_positive: int
    n_negative: int
    n_zero: int
    p_value: float
    n: int  # notes compared, zeros included

    @property
    def n_nonzero(self) -> int:
        return self.n_positive + self.n_negative


@dataclass(frozen=True)
class WilcoxonTest:
    """Two-sided Wilcoxon signed-rank test with zero differences dropped (zero_method='wilcox')."""

    statistic: float  # scipy's: min(W+, W-) for the two-sided test
    p_value: float
    n_nonzero: int
    n_zero: int
    n: int


@dataclass(frozen=True)
class TTests:
    """One-sample t-tests per column (per head) of a (notes x columns) matrix against `popmean`."""

    mean: np.ndarray
    t: np.ndarray
    p_value: np.ndarray
    n: int
    popmean: float


@dataclass(frozen=True)
class PairedComparison:
    """Task/fidelity comparison of two arms on the same notes (App. K "Statistics")."""

    mean_difference: Interval
    median_difference: float
    wilcoxon: WilcoxonTest
    sign: SignTest
    n: int


def _differences(a, b) -> np.ndarray:
    if b is None:
        return as_values(a, "differences")
    first, second = as_pair(a, b, ("a", "b"))
    return first - second


def sign_test(a, b=None) -> SignTest:
    """Two-sided sign test of a - b over notes (or of `a` as differences when b is None).

    Counts n+ = #{d_i > 0}, n- = #{d_i < 0}; zeros are dropped; p = binomtest(n+, n+ + n-, 1/2).
    With no non-zero difference there is no evidence either way and p = 1.
    """
    diff = _differences(a, b)
    n_positive = int((diff > 0).sum())
    n_negative = int((diff < 0).sum())
    n_zero = int(diff.size - n_positive - n_negative)
    if n_positive + n_negative == 0:
        p_value = 1.0
    else:
        p_value = float(stats.binomtest(n_positive, n_positive + n_negative, 0.5).pvalue)
    return SignTest(n_positive, n_negative, n_zero, p_value, int(diff.size))


def wilcoxon_signed_rank(a, b=None) -> WilcoxonTest:
    """Two-sided Wilcoxon signed-rank test of a - b, zero differences dropped (App. K).

    scipy.stats.wilcoxon with zero_method='wilcox' (drop zeros, then rank |d_i|, ties
    averaged) and its default method (exact for small samples without ties, otherwise
    the normal approximation).  With every difference zero the test is empty: p = 1.
    """
    diff = _differences(a, b)
    n_zero = int((diff == 0).sum())
    n_nonzero = int(diff.size - n_zero)
    if n_nonzero == 0:
        return WilcoxonTest(0.0, 1.0, 0, n_zero, int(diff.size))
    result = stats.wilcoxon(diff, zero_method="wilcox", alternative="two-sided")
    return WilcoxonTest(float(result.statistic), float(result.pvalue), n_nonzero, n_zero, int(diff.size))


def one_sample_t_tests(matrix, popmean: float = 0.0) -> TTests:
    """Two-sided one-sample t-test of every column's mean over notes against `popmean` (App. C).

    t_h = (mean_h - popmean) / (s_h / sqrt(n)), p from Student's t with n - 1 d.f.
    (scipy.stats.ttest_1samp).  A column constant at `popmean` (a head never touched)
    gets t = 0, p = 1, where scipy would return NaN; constant elsewhere, t = +-inf, p = 0.
    """
    values = as_values(matrix, "matrix", ndim=2, min_rows=2)
    with warnings.catch_warnings():
        # constant columns are handled below; scipy warns about their precision loss
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.ttest_1samp(values, popmean, axis=0)
    t = np.asarray(result.statistic, dtype=float)
    p = np.asarray(result.pvalue, dtype=float)
    spread = np.ptp(values, axis=0)
    at_null = (spread == 0) & (values[0] == popmean)
    t = np.where(at_null, 0.0, t)
    p = np.where(at_null, 1.0, p)
    constant = (spread == 0) & ~at_null
    t = np.where(constant, np.where(values[0] > popmean, np.inf, -np.inf), t)
    p = np.where(constant, 0.0, p)
    return TTests(mean=values.mean(axis=0), t=t, p_value=p, n=values.shape[0], popmean=float(popmean))


def one_sample_t_test(values, popmean: float = 0.0) -> TTests:
    """`one_sample_t_tests` for a single quantity (one column)."""
    return one_sample_t_tests(as_values(values, "values", min_rows=2)[:, None], popmean)


def paired_comparison(
    a, b, *, n_resamples: int = 1000, seed: int, confidence: float = 0.95
) -> PairedComparison:
    """Arm a against arm b on the same notes: mean difference with percentile bootstrap
    interval, median difference, two-sided Wilcoxon (zeros dropped) and sign test (App. K).

    a, b: per-note values, already averaged over seeds (`clustered.mean_over_seeds`).
    """
    first, second = as_pair(a, b, ("a", "b"))
    diff = first - second
    return PairedComparison(
        mean_difference=paired_bootstrap_mean_difference(
            first, second, n_resamples=n_resamples, seed=seed, confidence=confidence
        ),
        median_difference=float(np.median(diff)),
        wilcoxon=wilcoxon_signed_rank(diff),
        sign=sign_test(diff),
        n=int(diff.size),
    )
