"""Head-ranking statistics against scipy and hand-worked examples."""

import numpy as np
import pytest
from scipy import special, stats

from mistill.stats.checks import StatsInputError
from mistill.stats.heads import (
    heads_carrying_share,
    noise_floor,
    pooled_weights,
    rank_heads,
    recurrence_test,
    spearman_over_heads,
    split_half_stability,
    top_k_overlap,
)


def test_ranking_breaks_ties_by_index():
    np.testing.assert_array_equal(rank_heads([0.2, 0.5, 0.2, 0.9, 0.5]), [3, 1, 4, 0, 2])


def test_top_k_overlap_hand_worked():
    a = [0.9, 0.8, 0.7, 0.1, 0.0, 0.3]  # top-3: {0, 1, 2}
    b = [0.1, 0.9, 0.0, 0.8, 0.7, 0.2]  # top-3: {1, 3, 4}
    assert top_k_overlap(a, b, 3) == 1
    assert top_k_overlap(a, b, 6) == 6
    assert top_k_overlap(a, a, 2) == 2
    with pytest.raises(StatsInputError, match="exceeds"):
        top_k_overlap(a, b, 7)


def test_spearman_with_ties_equals_pearson_of_average_ranks():
    a = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 0.5])
    b = np.array([5.0, 6.0, 7.0, 8.0, 7.0, 9.0, 1.0])
    result = spearman_over_heads(a, b)
    expected = np.corrcoef(stats.rankdata(a), stats.rankdata(b))[0, 1]
    assert result.rho == pytest.approx(expected)
    assert result.p_value == pytest.approx(stats.spearmanr(a, b).pvalue)
    assert spearman_over_heads(a, -a).rho == pytest.approx(-1.0)
    with pytest.raises(StatsInputError, match="constant"):
        spearman_over_heads(a, np.ones_like(a))


def test_recurrence_matches_binomial_and_bonferroni():
    # 100 notes, 1,600 heads, each note's top-20 (the paper's setting). Head 0 is in every
    # note's top-20, head 1 in 30 notes, head 2 in 8, head 3 in 9; the rest of each top-20 is random.
    rng = np.random.default_rng(0)
    n_notes, n_heads = 100, 1600
    per_note = rng.uniform(0, 1, size=(n_notes, n_heads))
    per_note[:, 1:4] = -1.0  # heads 1-3 only where planted
    per_note[:, 0] = 10.0
    per_note[:30, 1] = 10.0
    per_note[:8, 2] = 10.0
    per_note[10:19, 3] = 10.0
    result = recurrence_test(per_note, 20)
    independent_counts = np.zeros(n_heads, dtype=int)
    for row in per_note:
        independent_counts[np.argpartition(-row, 20)[:20]] += 1  # ties impossible with uniform draws
    np.testing.assert_array_equal(result.counts, independent_counts)
    assert result.counts[:4].tolist() == [100, 30, 8, 9]
    assert result.counts.sum() == 20 * n_notes
    np.testing.assert_allclose(result.p_value, stats.binom.sf(result.counts - 1, n_notes, 20 / n_heads))
    assert result.expected_count == pytest.approx(1.25)
    # Bonferroni at 0.05 / 1600: the smallest count that passes is 9 notes
    # (P(X >= 9) = 5.1e-6 <= 3.125e-5 < P(X >= 8) = 4.0e-5)
    threshold_count = next(c for c in range(101) if stats.binom.sf(c - 1, 100, 0.0125) <= 0.05 / 1600)
    assert threshold_count == 9
    expected_recurrent = set(np.flatnonzero(result.counts >= threshold_count))
    assert set(np.flatnonzero(result.corrected.rejected)) == expected_recurrent
    assert {0, 1, 3} <= expected_recurrent and 2 not in expected_recurrent
    assert result.n_recurrent == len(expected_recurrent)


def test_pooled_weights_hand_worked():
    importance = np.array([0.1, 0.91, 0.45, 0.5, -0.3])
    result = pooled_weights(importance, 3)
    top = np.array([0.91, 0.5, 0.45])
    tau = np.sqrt(np.mean((top - top.mean()) ** 2))  # population s.d. of the top-3
    np.testing.assert_array_equal(result.heads, [1, 3, 2])
    assert result.tau == pytest.approx(tau)
    np.testing.assert_allclose(result.weights, special.softmax(top / tau))
    assert result.weights.sum() == pytest.approx(1.0)
    assert result.weights[0] == pytest.approx(0.8, abs=0.02)  # cf. App. C: k = 3 leader holds 0.81
    sample = pooled_weights(importance, 3, ddof=1)
    assert sample.tau == pytest.approx(np.std(top, ddof=1))
    assert sample.weights[0] < result.weights[0]  # a larger tau flattens the weights
    single = pooled_weights(importance, 1)
    assert (single.tau, single.weights.tolist()) == (0.0, [1.0])


def test_noise_floor_and_carrying_share_hand_worked():
    diffs = np.linspace(-1, 1, 201)  # |d| uniform on [0, 1] in steps of 0.01
    assert noise_floor(diffs) == pytest.approx(0.95)
    importance = np.array([5.0, 3.0, 1.0, 0.5, 0.5, -2.0, 0.01])
    # above floor 0.1: 5, 3, 1, .5, .5 (sum 10); 80% = 8 is reached by 5 + 3
    result = heads_carrying_share(importance, floor=0.1, share=0.8)
    assert (result.n_above_floor, result.n_carrying) == (5, 2)
    assert heads_carrying_share(importance, floor=0.1, share=0.81).n_carrying == 3
    assert heads_carrying_share(importance, floor=0.1, share=1.0).n_carrying == 5


def _brute_force_split(per_note, patients, seed, k):
    """One split re-derived by hand: first permutation of the sorted patient ids."""
    unique = np.unique(patients)
    half_a = np.random.default_rng(seed).permutation(unique)[: unique.size // 2]
    in_a = np.isin(patients, half_a)
    a, b = per_note[in_a].mean(axis=0), per_note[~in_a].mean(axis=0)
    top = lambda x: set(np.argsort(-x, kind="stable")[:k])
    return stats.spearmanr(a, b).statistic, len(top(a) & top(b)), in_a


def test_split_half_first_split_equals_brute_force_and_keeps_patients_whole():
    rng = np.random.default_rng(4)
    patients = np.array([f"p{i:02d}" for i in range(20)] + ["p03", "p07", "p11"])  # 3 second variants
    per_note = rng.normal(0, 1, size=(23, 60)) + np.linspace(2, 0, 60)  # a real ranking plus noise
    result = split_half_stability(per_note, patients, n_splits=1, seed=9, ks=(8,), full_k=10)
    rho, overlap8, in_a = _brute_force_split(per_note, patients, 9, 8)
    assert result.spearman[0] == pytest.approx(rho)
    assert result.overlap[8][0] == overlap8
    for p in ("p03", "p07", "p11"):
        assert len(set(in_a[patients == p])) == 1  # a patient's variants sit on one side
    assert (result.n_patients, result.n_notes, result.n_splits) == (20, 23, 1)


def test_split_half_on_identical_halves_is_perfectly_stable():
    rng = np.random.default_rng(5)
    base = rng.normal(size=50)
    per_note = np.tile(base, (12, 1))  # every note ranks the heads identically
    result = split_half_stability(per_note, np.arange(12) // 2, n_splits=20, seed=0, ks=(8, 40), full_k=40)
    assert result.median_spearman == pytest.approx(1.0)
    assert result.median_overlap == {8: 8.0, 40: 40.0}
    assert result.median_full_overlap == 40.0
    noise = split_half_stability(
        rng.normal(size=(40, 200)), np.arange(40), n_splits=20, seed=0, ks=(8,), full_k=40
    )
    assert abs(noise.median_spearman) < 0.2  # pure noise: halves do not agree
