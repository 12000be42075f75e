"""The split-half carry of App. D ("the top-8 chosen on one half carries 0.83 to 1.00 of the other half's
own best eight") and the exact-merged per-note importance it reads: hand-worked, by its bounds, and
against a loop written from the definition."""

import numpy as np
import pytest

from mistill.stats.checks import StatsInputError
from mistill.stats.heads import exact_merged, split_half_carry, split_half_stability, top_k_carry


def test_exact_merged_hand_worked():
    first_order = np.array([[1.0, 2.0, 3.0, 4.0],
                            [5.0, 6.0, 7.0, 8.0],
                            [9.0, 9.0, 9.0, 9.0]])
    patches = [([1, 3], [20.0, 40.0]), ([1], [60.0]), None]  # the third event was not patched
    # event 0 -> [1, 20, 3, 40]; event 1 -> [5, 60, 7, 8]; event 2 does not enter
    np.testing.assert_allclose(exact_merged(first_order, patches), [3.0, 40.0, 5.0, 24.0])
    with pytest.raises(StatsInputError, match="no event"):
        exact_merged(first_order, [None, None, None])
    with pytest.raises(StatsInputError, match="outside"):
        exact_merged(first_order, [([4], [1.0]), None, None])


def test_carry_hand_worked_two_patients():
    # two patients, one note each: every split is {A} against {B}, and both directions are read
    importance = np.array([[4.0, 3.0, 1.0, 0.0],    # A: best two {0, 1}, sum 7
                           [1.0, 3.0, 2.0, 5.0]])   # B: best two {3, 1}, sum 8
    ranking = np.array([[0.0, 1.0, 5.0, 0.0],       # A's ranking picks {2, 1}
                        [1.0, 0.0, 0.0, 2.0]])      # B's ranking picks {3, 0}
    result = split_half_carry(ranking, importance, ["a", "b"], k=2, n_splits=3, seed=0)
    # by importance: A's {0, 1} on B = (1 + 3) / 8; B's {3, 1} on A = (0 + 3) / 7
    # by ranking:    A's {2, 1} on B = (2 + 3) / 8; B's {3, 0} on A = (0 + 4) / 7
    assert sorted(result.by_importance[0]) == pytest.approx(sorted([4 / 8, 3 / 7]))
    assert sorted(result.by_ranking[0]) == pytest.approx(sorted([5 / 8, 4 / 7]))
    assert result.median_by_importance == pytest.approx((4 / 8 + 3 / 7) / 2)
    assert result.median_by_ranking == pytest.approx((5 / 8 + 4 / 7) / 2)
    assert (result.k, result.n_splits, result.n_patients, result.n_notes) == (2, 3, 2, 2)
    # out of sample the half's own exact top-k is not the best pick for the other half: here the
    # ranking's set carries more in both directions
    assert (result.by_ranking > result.by_importance).all()


def test_identical_halves_carry_everything():
    rng = np.random.default_rng(1)
    importance = np.tile(rng.normal(size=30), (12, 1))  # every note has the same importance
    ranking = importance + 0.01 * rng.normal(size=(12, 30))  # a ranking that orders the top the same
    assert set(np.argsort(-ranking.mean(0))[:5]) == set(np.argsort(-importance[0])[:5])
    result = split_half_carry(ranking, importance, np.arange(12) // 2, k=5, n_splits=20, seed=0)
    np.testing.assert_allclose(result.by_importance, 1.0)
    assert result.median_by_importance == pytest.approx(1.0)
    assert result.median_by_ranking == pytest.approx(1.0)


def test_carry_never_exceeds_one_and_the_own_pick_is_the_in_sample_best():
    rng = np.random.default_rng(2)
    importance = rng.normal(0, 1, size=(30, 40)) + np.linspace(3, 0, 40)
    ranking = rng.normal(0, 1, size=(30, 40))
    result = split_half_carry(ranking, importance, np.arange(30) // 2, k=6, n_splits=50, seed=3)
    assert (result.by_ranking <= 1 + 1e-12).all() and (result.by_importance <= 1 + 1e-12).all()
    # read on the half that picked it, a half's own exact top-k carries all of its own best k, and no
    # other pick carries more
    half = importance[:10].mean(0)
    assert top_k_carry(half, half, 6) == pytest.approx(1.0)
    for chooser in rng.normal(size=(20, 40)):
        assert top_k_carry(chooser, half, 6) <= 1 + 1e-12


def test_carry_needs_a_positive_best_k():
    with pytest.raises(StatsInputError, match="sum to"):
        top_k_carry([1.0, 2.0, 3.0], [-1.0, -2.0, -3.0], 2)
    with pytest.raises(StatsInputError, match="exceeds"):
        split_half_carry(np.ones((4, 3)), np.ones((4, 3)), [0, 0, 1, 1], k=4)
    with pytest.raises(StatsInputError, match="differ in shape"):
        split_half_carry(np.ones((4, 3)), np.ones((4, 2)), [0, 0, 1, 1], k=1)


def _brute_force_carry(ranking, importance, patients, k, n_splits, seed):
    """The definition written out: the halves as split_half_stability documents them, each half's means
    head by head, sets by sorting (value descending, index ascending), sums by loops."""
    unique = sorted(set(patients))
    rng = np.random.default_rng(seed)
    n_notes, n_heads = importance.shape

    def mean_of(values, notes):
        return [sum(values[n][h] for n in notes) / len(notes) for h in range(n_heads)]

    def best(values):
        return sorted(range(n_heads), key=lambda h: (-values[h], h))[:k]

    by_ranking, by_importance = [], []
    for _ in range(n_splits):
        half_a = set(rng.permutation(unique)[: len(unique) // 2].tolist())
        a = [n for n in range(n_notes) if patients[n] in half_a]
        b = [n for n in range(n_notes) if patients[n] not in half_a]
        for chosen, other in ((a, b), (b, a)):
            carried = mean_of(importance, other)
            own = sum(carried[h] for h in best(carried))
            by_ranking.append(sum(carried[h] for h in best(mean_of(ranking, chosen))) / own)
            by_importance.append(sum(carried[h] for h in best(mean_of(importance, chosen))) / own)
    return np.array(by_ranking).reshape(n_splits, 2), np.array(by_importance).reshape(n_splits, 2)


def test_carry_equals_brute_force_on_the_stability_splits():
    rng = np.random.default_rng(4)
    patients = [f"p{i:02d}" for i in range(14)] + ["p03", "p07", "p11"]  # 3 second prompt variants
    importance = rng.normal(0, 1, size=(17, 24)) + np.linspace(2, 0, 24)
    ranking = importance + rng.normal(0, 1, size=(17, 24))
    result = split_half_carry(ranking, importance, patients, k=4, n_splits=15, seed=9)
    by_ranking, by_importance = _brute_force_carry(ranking, importance, patients, 4, 15, 9)
    np.testing.assert_allclose(result.by_ranking, by_ranking)
    np.testing.assert_allclose(result.by_importance, by_importance)
    assert result.median_by_ranking == pytest.approx(np.median(by_ranking))
    # the same halves as split_half_stability: with one per-note array as both, the carry is 1 exactly
    # when the two halves' top-k coincide, which is when the stability's top-k overlap is k
    values = ranking + np.linspace(6, 0, 24) + 10.0  # some splits agree on the top-4, some do not
    same = split_half_carry(values, values, patients, k=4, n_splits=15, seed=9)
    overlap = split_half_stability(values, patients, n_splits=15, seed=9, ks=(4,), full_k=4).overlap[4]
    assert 0 < (overlap == 4).sum() < 15
    np.testing.assert_array_equal(np.isclose(same.by_importance, 1.0).all(axis=1), overlap == 4)
    np.testing.assert_array_equal(same.by_ranking, same.by_importance)
