"""Note-clustered, seed-matched comparison of two arms (App. K "Statistics").

Mechanism differences (M4, M2, M1 per note) pair seed i of one arm with seed i of the
other; a one-seed reference pairs with every seed.  A note's seed pairs are not
independent trials, so the test is note-clustered: per note, the mean of its seed
pairs' differences,

    d_n = (1/|P|) sum_{(i, j) in P} (x_arm[i, n] - x_ref[j, n]),

then a two-sided sign test and a Wilcoxon signed-rank test over the notes and a
bootstrap-over-notes interval of the mean of d_n.  The pooled note-pair counts (450
for three pairs over 150 notes) are kept as descriptive, not as the test; each seed
pair's own sign test is kept too (the paper reads "every seed pair separately").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from mistill.stats.bootstrap import Interval, bootstrap_mean
from mistill.stats.checks import StatsInputError, as_values
from mistill.stats.paired import SignTest, WilcoxonTest, sign_test, wilcoxon_signed_rank


@dataclass(frozen=True)
class SeedPairResult:
    """One seed pair's own comparison over the notes (not the reported test)."""

    arm_seed: int
    reference_seed: int
    median_difference: float
    sign: SignTest


@dataclass(frozen=True)
class PooledPairCounts:
    """Counts over all (note, seed pair) differences: descriptive only (App. K)."""

    n_note_pairs: int
    n_positive: int
    n_negative: int
    n_zero: int


@dataclass(frozen=True)
class ClusteredComparison:
    per_note_difference: np.ndarray  # d_n, one per note
    mean_difference: Interval  # mean over notes of d_n, percentile bootstrap over notes
    median_difference: float  # median over notes of d_n (the tables' "median of per-note differences")
    sign: SignTest  # reported test: n_positive is the "notes higher" count
    wilcoxon: WilcoxonTest
    seed_pairs: tuple[SeedPairResult, ...]
    pooled: PooledPairCounts
    n_notes: int


def matched_seed_pairs(arm_seeds, reference_seeds) -> list[tuple[int, int]]:
    """Seed i against seed i; a one-seed side pairs with every seed of the other (App. K).

    Two multi-seed arms must have the same seeds: a missing seed would silently drop a
    pair the reading rule (an effect must hold against every seed, App. L) depends on.
    """
    arm = sorted(int(s) for s in arm_seeds)
    reference = sorted(int(s) for s in reference_seeds)
    if not arm or not reference:
        raise StatsInputError("each arm needs at least one seed")
    if len(reference) == 1:
        return [(s, reference[0]) for s in arm]
    if len(arm) == 1:
        return [(arm[0], s) for s in reference]
    if arm != reference:
        raise StatsInputError(
            f"seed sets differ and neither side has one seed: arm {arm}, reference {reference}"
        )
    return [(s, s) for s in arm]


def _by_seed(values_by_seed: Mapping, name: str) -> dict[int, np.ndarray]:
    if not isinstance(values_by_seed, Mapping) or not values_by_seed:
        raise StatsInputError(f"{name}: expected a non-empty mapping seed -> per-note values")
    out = {int(seed): as_values(v, f"{name}[seed {seed}]") for seed, v in values_by_seed.items()}
    lengths = {v.shape[0] for v in out.values()}
    if len(lengths) != 1:
        raise StatsInputError(f"{name}: seeds cover different note counts {sorted(lengths)}")
    return out


def mean_over_seeds(values_by_seed: Mapping) -> np.ndarray:
    """Per-note value averaged over seeds: the unit of the task and fidelity tests (App. K)."""
    values = _by_seed(values_by_seed, "values_by_seed")
    return np.mean(np.stack(list(values.values())), axis=0)


def note_clustered_comparison(
    arm_by_seed: Mapping,
    reference_by_seed: Mapping,
    *,
    n_resamples: int = 1000,
    seed: int,
    confidence: float = 0.95,
) -> ClusteredComparison:
    """Arm minus reference, seed-matched and clustered by note (App. K "Statistics").

    arm_by_seed, reference_by_seed: seed -> per-note values (same note order for every
    seed of both arms; notes without the quantity are dropped before the call).
    `seed` seeds the bootstrap.
    """
    arm = _by_seed(arm_by_seed, "arm_by_seed")
    reference = _by_seed(reference_by_seed, "reference_by_seed")
    n_arm = next(iter(arm.values())).shape[0]
    n_ref = next(iter(reference.values())).shape[0]
    if n_arm != n_ref:
        raise StatsInputError(f"arm and reference cover different note counts: {n_arm} vs {n_ref}")
    pairs = matched_seed_pairs(arm, reference)
    pair_differences = np.stack([arm[i] - reference[j] for i, j in pairs])  # (pairs, notes)
    per_note = pair_differences.mean(axis=0)
    return ClusteredComparison(
        per_note_difference=per_note,
        mean_difference=bootstrap_mean(
            per_note,
            n_resamples=n_resamples,
            seed=seed,
            confidence=confidence,
            statistic=(
                f"mean over notes of the per-note mean seed-matched difference ({len(pairs)} pair(s)), "
                f"percentile bootstrap over notes {confidence:.0%} ({n_resamples} resamples, seed {seed})"
            ),
        ),
        median_difference=float(np.median(per_note)),
        sign=sign_test(per_note),
        wilcoxon=wilcoxon_signed_rank(per_note),
        seed_pairs=tuple(
            SeedPairResult(i, j, float(np.median(d)), sign_test(d))
            for (i, j), d in zip(pairs, pair_differences)
        ),
        pooled=PooledPairCounts(
            n_note_pairs=int(pair_differences.size),
            n_positive=int((pair_differences > 0).sum()),
            n_negative=int((pair_differences < 0).sum()),
            n_zero=int((pair_differences == 0).sum()),
        ),
        n_notes=int(per_note.size),
    )
