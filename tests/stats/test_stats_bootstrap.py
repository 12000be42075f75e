"""Percentile bootstrap over notes against scipy.stats.bootstrap and brute-force resampling."""

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import f1_score

from mistill.stats import bootstrap as bs
from mistill.stats.bootstrap import (
    NoteCounts,
    bootstrap_column_means,
    bootstrap_mean,
    bootstrap_percentile_p_values,
    corpus_bootstrap,
    micro_f1,
    paired_bootstrap_mean_difference,
    paired_corpus_bootstrap_difference,
    seed_matched_corpus_bootstrap_difference,
)
from mistill.stats.checks import StatsInputError

# Fixed data with ties and a zero, as per-note values.
VALUES = np.array([0.3, -0.1, 0.3, 0.0, 1.2, 0.3, -0.4, 0.8, 0.8, 0.05, 0.0, 2.0, -1.0, 0.3, 0.6])


def test_bootstrap_mean_equals_scipy_percentile_method():
    ours = bootstrap_mean(VALUES, n_resamples=1000, seed=7)
    ref = stats.bootstrap(
        (VALUES,), np.mean, n_resamples=1000, method="percentile", rng=np.random.default_rng(7)
    ).confidence_interval
    assert ours.estimate == pytest.approx(VALUES.mean())
    assert ours.low == pytest.approx(ref.low, abs=1e-12)
    assert ours.high == pytest.approx(ref.high, abs=1e-12)
    assert (ours.n, ours.n_resamples, ours.seed, ours.confidence) == (15, 1000, 7, 0.95)
    assert "percentile bootstrap" in ours.statistic


def test_paired_difference_equals_scipy_paired_bootstrap():
    rng = np.random.default_rng(0)
    b = np.round(rng.normal(size=VALUES.size), 1)
    ours = paired_bootstrap_mean_difference(VALUES, b, n_resamples=1000, seed=3, confidence=0.9)
    ref = stats.bootstrap(
        (VALUES, b),
        lambda x, y, axis=-1: np.mean(x - y, axis=axis),
        paired=True,
        n_resamples=1000,
        method="percentile",
        confidence_level=0.9,
        rng=np.random.default_rng(3),
    ).confidence_interval
    assert ours.estimate == pytest.approx(np.mean(VALUES - b))
    assert (ours.low, ours.high) == pytest.approx((ref.low, ref.high), abs=1e-12)


def test_column_means_share_draws_and_match_per_column_scipy():
    rng = np.random.default_rng(1)
    matrix = rng.normal(size=(30, 4))
    result = bootstrap_column_means(matrix, n_resamples=500, seed=11)
    for col in range(4):
        ref = stats.bootstrap(
            (matrix[:, col],), np.mean, n_resamples=500, method="percentile", rng=np.random.default_rng(11)
        ).confidence_interval
        assert result.low[col] == pytest.approx(ref.low, abs=1e-12)
        assert result.high[col] == pytest.approx(ref.high, abs=1e-12)
    np.testing.assert_allclose(result.estimate, matrix.mean(axis=0))


def test_batched_draws_equal_one_batch(monkeypatch):
    whole = bootstrap_mean(VALUES, n_resamples=1000, seed=5)
    monkeypatch.setattr(bs, "_BATCH_CELLS", 7 * VALUES.size)  # 7 resamples per batch
    batched = bootstrap_mean(VALUES, n_resamples=1000, seed=5)
    assert (batched.low, batched.high) == pytest.approx((whole.low, whole.high), abs=1e-12)


def test_resample_counts_are_the_drawn_indices():
    draws = np.random.default_rng(9).integers(0, 6, size=(4, 6))
    (counts,) = list(bs.resample_count_batches(6, 4, 9))
    for row, drawn in zip(counts, draws):
        np.testing.assert_array_equal(row, np.bincount(drawn, minlength=6))
    assert (counts.sum(axis=1) == 6).all()


def test_hand_worked_two_point_interval():
    # Notes {0, 1}: a resample's mean is 0, 1/2 or 1 with probabilities 1/4, 1/2, 1/4, so
    # the 2.5th and 97.5th percentiles of many resamples are exactly 0 and 1.
    result = bootstrap_mean([0.0, 1.0], n_resamples=4000, seed=0)
    assert (result.low, result.high) == (0.0, 1.0)
    assert not result.excludes_zero
    constant = bootstrap_mean([0.2] * 5, n_resamples=100, seed=0)
    assert (constant.low, constant.high) == pytest.approx((0.2, 0.2))
    assert constant.excludes_zero


def test_bootstrap_p_values_match_brute_force():
    rng = np.random.default_rng(2)
    matrix = np.column_stack([rng.normal(0.0, 1, 25), rng.normal(2.0, 1, 25), rng.normal(-0.3, 1, 25)])
    p = bootstrap_percentile_p_values(matrix, n_resamples=400, seed=4)
    draws = np.random.default_rng(4).integers(0, 25, size=(400, 25))
    means = matrix[draws].mean(axis=1)  # (400, 3)
    expected = np.minimum(1, 2 * np.minimum((means <= 0).mean(axis=0), (means >= 0).mean(axis=0)))
    np.testing.assert_allclose(p, expected)
    assert p[1] == 0.0  # no resample of a clearly positive column crosses zero: p is exactly 0


def _multilabel(seed, n_notes=24, n_labels=10):
    rng = np.random.default_rng(seed)
    gold = rng.random((n_notes, n_labels)) < 0.3
    gold[np.arange(n_notes), rng.integers(0, n_labels, n_notes)] = True  # every note has a gold code
    pred = np.where(rng.random((n_notes, n_labels)) < 0.7, gold, rng.random((n_notes, n_labels)) < 0.2)
    return gold, pred


def _counts(gold, pred):
    return NoteCounts(
        tp=(gold & pred).sum(axis=1), fp=(~gold & pred).sum(axis=1), fn=(gold & ~pred).sum(axis=1)
    )


def test_micro_f1_equals_sklearn():
    gold, pred = _multilabel(0)
    c = _counts(gold, pred)
    assert float(micro_f1(c.tp.sum(), c.fp.sum(), c.fn.sum())) == pytest.approx(
        f1_score(gold, pred, average="micro")
    )
    assert float(micro_f1(0, 0, 0)) == 0.0  # sklearn's zero_division=0


def test_corpus_bootstrap_equals_brute_force_sklearn():
    gold, pred = _multilabel(1)
    result = corpus_bootstrap(_counts(gold, pred), n_resamples=200, seed=0)
    draws = np.random.default_rng(0).integers(0, gold.shape[0], size=(200, gold.shape[0]))
    reps = [f1_score(gold[d], pred[d], average="micro", zero_division=0) for d in draws]
    assert result.estimate == pytest.approx(f1_score(gold, pred, average="micro"))
    assert (result.low, result.high) == pytest.approx(tuple(np.percentile(reps, [2.5, 97.5])), abs=1e-12)
    assert result.n_resamples == 200 and result.seed == 0


def test_paired_corpus_difference_equals_brute_force_sklearn():
    gold, pred_a = _multilabel(2)
    _, pred_b = _multilabel(3)
    result = paired_corpus_bootstrap_difference(
        _counts(gold, pred_a), _counts(gold, pred_b), n_resamples=200, seed=1
    )
    draws = np.random.default_rng(1).integers(0, gold.shape[0], size=(200, gold.shape[0]))
    reps = [
        f1_score(gold[d], pred_a[d], average="micro") - f1_score(gold[d], pred_b[d], average="micro")
        for d in draws
    ]
    assert result.estimate == pytest.approx(
        f1_score(gold, pred_a, average="micro") - f1_score(gold, pred_b, average="micro")
    )
    assert (result.low, result.high) == pytest.approx(tuple(np.percentile(reps, [2.5, 97.5])), abs=1e-12)


def test_seed_matched_corpus_difference_equals_brute_force_sklearn():
    """Three seed pairs: each resample is the mean over pairs of the pooled micro-F1 differences."""
    gold, _ = _multilabel(5)
    preds_a = [_multilabel(s)[1] for s in (6, 7, 8)]
    preds_b = [_multilabel(s)[1] for s in (9, 10, 11)]
    result = seed_matched_corpus_bootstrap_difference(
        [(_counts(gold, a), _counts(gold, b)) for a, b in zip(preds_a, preds_b)], n_resamples=150, seed=3
    )
    draws = np.random.default_rng(3).integers(0, gold.shape[0], size=(150, gold.shape[0]))

    def difference(rows):
        return np.mean([f1_score(gold[rows], a[rows], average="micro") - f1_score(gold[rows], b[rows], average="micro")
                        for a, b in zip(preds_a, preds_b)])

    assert result.estimate == pytest.approx(difference(np.arange(gold.shape[0])))
    reps = [difference(d) for d in draws]
    assert (result.low, result.high) == pytest.approx(tuple(np.percentile(reps, [2.5, 97.5])), abs=1e-12)
    assert "mean over 3 seed pairs" in result.statistic


def test_seed_matched_corpus_difference_with_one_pair_is_the_paired_bootstrap():
    gold, pred_a = _multilabel(12)
    _, pred_b = _multilabel(13)
    a, b = _counts(gold, pred_a), _counts(gold, pred_b)
    one = seed_matched_corpus_bootstrap_difference([(a, b)], n_resamples=300, seed=4)
    paired = paired_corpus_bootstrap_difference(a, b, n_resamples=300, seed=4)
    assert (one.estimate, one.low, one.high) == (paired.estimate, paired.low, paired.high)


def test_seed_matched_corpus_difference_rejects_mismatched_notes():
    gold, pred = _multilabel(14)
    short = _counts(gold[:10], pred[:10])
    with pytest.raises(StatsInputError, match="different note counts"):
        seed_matched_corpus_bootstrap_difference([(_counts(gold, pred), short)])
    with pytest.raises(StatsInputError, match="at least one"):
        seed_matched_corpus_bootstrap_difference([])


def test_corpus_bootstrap_default_is_ten_thousand_resamples_seed_zero():
    gold, pred = _multilabel(4)
    result = corpus_bootstrap(_counts(gold, pred))
    assert (result.n_resamples, result.seed) == (10_000, 0)
    assert result.low <= result.estimate <= result.high
