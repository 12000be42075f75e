"""Multiple comparisons over heads: Benjamini-Hochberg and Bonferroni (App. C, App. D).

App. C: per-head p-values from one-sample t-tests across the per-note means, then
Benjamini-Hochberg (1995) at FDR 0.05 over all 1,600 heads; each discovery is signed
by its mean, giving the paper's "heads with I_c > 0" and "I_c < 0" counts (429 / 546 for
the chapter decision; 309 / 282 for raw importance at NULL events; 0 / 0 for one half
of the NULL events against the other).  Bootstrap percentile p-values are not used
here: they are too coarse (see `bootstrap.bootstrap_percentile_p_values`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from statsmodels.stats.multitest import multipletests

from mistill.stats.checks import StatsInputError, as_values
from mistill.stats.paired import one_sample_t_tests


@dataclass(frozen=True)
class Discoveries:
    """Which hypotheses a correction rejects, with the signed counts."""

    rejected: np.ndarray  # bool per hypothesis
    adjusted_p: np.ndarray  # BH q-values or Bonferroni-adjusted p-values
    n_discoveries: int
    n_positive: int  # rejected with a positive sign (e.g. mean I_c > 0)
    n_negative: int
    n_tests: int
    level: float  # FDR for BH, family-wise alpha for Bonferroni
    method: str


@dataclass(frozen=True)
class HeadDiscoveries:
    """One-sample t-tests per head across notes, then Benjamini-Hochberg (App. C)."""

    mean: np.ndarray
    t: np.ndarray
    p_value: np.ndarray
    discoveries: Discoveries
    n_notes: int


def _check_p_values(p_values) -> np.ndarray:
    p = as_values(p_values, "p_values")
    if ((p < 0) | (p > 1)).any():
        raise StatsInputError("p_values must lie in [0, 1]")
    return p


def _check_level(level: float, name: str) -> float:
    if not 0.0 < float(level) < 1.0:
        raise StatsInputError(f"{name} must lie in (0, 1), got {level!r}")
    return float(level)


def _signs(signs, n: int) -> np.ndarray:
    if signs is None:
        return np.ones(n)
    array = as_values(signs, "signs")
    if array.shape != (n,):
        raise StatsInputError(f"signs: expected {n} values, one per p-value, got {array.shape[0]}")
    return np.sign(array)


def _correct(p_values, level, signs, method: str, label: str) -> Discoveries:
    p = _check_p_values(p_values)
    level = _check_level(level, label)
    sign = _signs(signs, p.size)
    rejected, adjusted, _, _ = multipletests(p, alpha=level, method=method)
    rejected = np.asarray(rejected, dtype=bool)
    return Discoveries(
        rejected=rejected,
        adjusted_p=np.asarray(adjusted, dtype=float),
        n_discoveries=int(rejected.sum()),
        n_positive=int((rejected & (sign > 0)).sum()),
        n_negative=int((rejected & (sign < 0)).sum()),
        n_tests=int(p.size),
        level=level,
        method=method,
    )


def benjamini_hochberg(p_values, fdr: float = 0.05, *, signs=None) -> Discoveries:
    """Benjamini-Hochberg step-up at false-discovery rate `fdr` (statsmodels 'fdr_bh').

    With p_(1) <= ... <= p_(m), reject H_(1..k*) for k* = max{k : p_(k) <= k * fdr / m}.
    `signs` (e.g. each head's mean) splits the discoveries into positive and negative.
    """
    return _correct(p_values, fdr, signs, "fdr_bh", "fdr")


def bonferroni(p_values, alpha: float = 0.05, *, signs=None) -> Discoveries:
    """Bonferroni: reject where p <= alpha / m (statsmodels 'bonferroni')."""
    return _correct(p_values, alpha, signs, "bonferroni", "alpha")


def head_discoveries(per_note, fdr: float = 0.05, popmean: float = 0.0) -> HeadDiscoveries:
    """Heads whose mean over notes differs from `popmean`, BH-controlled (App. C).

    per_note: (n_notes, n_heads), e.g. per-note I_c of every head, or per-note
    (NULL half A - NULL half B) for the calibration check that must declare nothing.
    Two-sided t-tests; BH over all heads; each discovery signed by its mean.
    """
    tests = one_sample_t_tests(per_note, popmean)
    return HeadDiscoveries(
        mean=tests.mean,
        t=tests.t,
        p_value=tests.p_value,
        discoveries=benjamini_hochberg(tests.p_value, fdr, signs=tests.mean - popmean),
        n_notes=tests.n,
    )
