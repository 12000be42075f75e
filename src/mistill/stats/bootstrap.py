"""Percentile bootstrap over notes (Efron, 1979): App. C "Statistics", App. K "Statistics".

The paper resamples notes with replacement, 1,000 times for characterization intervals
and paired task/fidelity differences, 10,000 times (seed 0) for the corpus-level micro-F1
difference (Table 43), and reports the 2.5th and 97.5th percentiles of the resampled
statistic.

Written on numpy's Generator rather than `scipy.stats.bootstrap` so one matrix of
resample counts serves many columns at once (1,600 heads, both arms of a paired corpus
metric) with identical note draws; the draws and percentiles equal scipy's
`method='percentile'` for the same seed (tested).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from mistill.stats.checks import (
    StatsInputError,
    as_confidence,
    as_count,
    as_pair,
    as_seed,
    as_values,
)

# Rows of resample counts built per batch, so 10,000 resamples of thousands of notes
# never materialise one huge index matrix; the Generator fills rows in order, so the
# draws are the same as one (n_resamples, n) call.
_BATCH_CELLS = 4_000_000


@dataclass(frozen=True)
class Interval:
    """A point estimate with its percentile bootstrap interval."""

    estimate: float
    low: float
    high: float
    confidence: float
    n: int
    n_resamples: int
    seed: int
    statistic: str

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0.0 or self.high < 0.0


@dataclass(frozen=True)
class ColumnIntervals:
    """Per-column (e.g. per-head) estimates and percentile intervals from shared note draws."""

    estimate: np.ndarray
    low: np.ndarray
    high: np.ndarray
    confidence: float
    n: int
    n_resamples: int
    seed: int
    statistic: str

    @property
    def excludes_zero(self) -> np.ndarray:
        return (self.low > 0.0) | (self.high < 0.0)


@dataclass(frozen=True)
class NoteCounts:
    """Per-note confusion counts of one arm: true positives, false positives, false negatives."""

    tp: np.ndarray
    fp: np.ndarray
    fn: np.ndarray

    def __post_init__(self):
        for name in ("tp", "fp", "fn"):
            array = as_values(getattr(self, name), name)
            if (array < 0).any() or (array != np.round(array)).any():
                raise StatsInputError(f"{name}: counts must be non-negative integers")
            object.__setattr__(self, name, array)
        if not (self.tp.shape == self.fp.shape == self.fn.shape):
            raise StatsInputError(
                f"tp/fp/fn lengths differ: {self.tp.shape[0]}, {self.fp.shape[0]}, {self.fn.shape[0]}"
            )

    @property
    def n(self) -> int:
        return int(self.tp.shape[0])

    def matrix(self) -> np.ndarray:
        """(n_notes, 3) columns tp, fp, fn."""
        return np.stack([self.tp, self.fp, self.fn], axis=1)


def resample_count_batches(n: int, n_resamples: int, seed: int) -> Iterator[np.ndarray]:
    """Batches of a (n_resamples, n) matrix: how often each note is drawn in each resample.

    Draws are `Generator.integers(0, n, size=(n_resamples, n))` with `default_rng(seed)`,
    row by row (the same stream `scipy.stats.bootstrap` uses), so a resampled mean is
    `counts @ values / n`.
    """
    rng = np.random.default_rng(seed)
    rows_per_batch = max(1, _BATCH_CELLS // max(n, 1))
    done = 0
    while done < n_resamples:
        rows = min(rows_per_batch, n_resamples - done)
        draws = rng.integers(0, n, size=(rows, n))
        flat = (draws + (np.arange(rows) * n)[:, None]).ravel()
        yield np.bincount(flat, minlength=rows * n).reshape(rows, n)
        done += rows


def _resampled_means(matrix: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    """(n_resamples, n_columns) means of the rows drawn in each resample."""
    n = matrix.shape[0]
    return np.concatenate(
        [counts @ matrix / n for counts in resample_count_batches(n, n_resamples, seed)], axis=0
    )


def _percentiles(replicates: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    # Percentile interval: the alpha/2 and 1 - alpha/2 quantiles (linear interpolation, as scipy).
    alpha = (1.0 - confidence) / 2.0
    low, high = np.percentile(replicates, [100.0 * alpha, 100.0 * (1.0 - alpha)], axis=0)
    return low, high


def bootstrap_column_means(
    matrix, *, n_resamples: int = 1000, seed: int, confidence: float = 0.95, statistic: str | None = None
) -> ColumnIntervals:
    """Mean over notes of each column with its percentile bootstrap interval (App. C).

    matrix: (n_notes, n_columns), e.g. per-note I_c of every head.  All columns share the
    same note draws, so per-head intervals come from one pass.
    """
    values = as_values(matrix, "matrix", ndim=2)
    n_resamples = as_count(n_resamples, "n_resamples")
    seed = as_seed(seed)
    confidence = as_confidence(confidence)
    replicates = _resampled_means(values, n_resamples, seed)
    low, high = _percentiles(replicates, confidence)
    return ColumnIntervals(
        estimate=values.mean(axis=0),
        low=low,
        high=high,
        confidence=confidence,
        n=values.shape[0],
        n_resamples=n_resamples,
        seed=seed,
        statistic=statistic
        or f"mean over notes, percentile bootstrap {confidence:.0%} ({n_resamples} resamples, seed {seed})",
    )


def bootstrap_mean(
    values, *, n_resamples: int = 1000, seed: int, confidence: float = 0.95, statistic: str | None = None
) -> Interval:
    """Mean over notes with its percentile bootstrap interval: resample notes with replacement.

    CI = [q_{alpha/2}, q_{1-alpha/2}] of { mean(x*_b) : b = 1..B }, x*_b a resample of the notes.
    """
    column = as_values(values, "values")[:, None]
    result = bootstrap_column_means(
        column, n_resamples=n_resamples, seed=seed, confidence=confidence, statistic=statistic
    )
    return Interval(
        estimate=float(result.estimate[0]),
        low=float(result.low[0]),
        high=float(result.high[0]),
        confidence=result.confidence,
        n=result.n,
        n_resamples=result.n_resamples,
        seed=result.seed,
        statistic=result.statistic,
    )


def paired_bootstrap_mean_difference(
    a, b, *, n_resamples: int = 1000, seed: int, confidence: float = 0.95
) -> Interval:
    """Mean paired difference mean_i(a_i - b_i) over notes, percentile bootstrap (App. K).

    a, b: per-note values of two arms in the same note order (for task and fidelity the
    per-note value is already averaged over seeds).
    """
    first, second = as_pair(a, b, ("a", "b"))
    n_resamples = as_count(n_resamples, "n_resamples")
    return bootstrap_mean(
        first - second,
        n_resamples=n_resamples,
        seed=seed,
        confidence=confidence,
        statistic=(
            f"mean paired difference over notes, percentile bootstrap {confidence:.0%} "
            f"({n_resamples} resamples, seed {seed})"
        ),
    )


def bootstrap_percentile_p_values(matrix, *, n_resamples: int = 1000, seed: int) -> np.ndarray:
    """Two-sided bootstrap percentile p-value per column: 2 * min(P*(mean* <= 0), P*(mean* >= 0)).

    App. C: NOT to be fed to Benjamini-Hochberg.  With 1,000 resamples the p-value is
    quantised at 1/1,000 and is 0 whenever no resample crosses zero; the percentile
    interval also ignores the t-distribution's heavier tails, so on pure noise BH over
    1,600 such p-values declares spurious discoveries (the paper's synthetic check gave
    13).  Per-head p-values come from `paired.one_sample_t_tests`.  Kept for that check.
    """
    values = as_values(matrix, "matrix", ndim=2)
    n_resamples = as_count(n_resamples, "n_resamples")
    replicates = _resampled_means(values, n_resamples, as_seed(seed))
    below = (replicates <= 0.0).mean(axis=0)
    above = (replicates >= 0.0).mean(axis=0)
    return np.minimum(1.0, 2.0 * np.minimum(below, above))


def micro_f1(tp, fp, fn) -> np.ndarray:
    """Corpus micro-F1 = 2 TP / (2 TP + FP + FN) from pooled counts (App. K "External task metrics").

    Vectorised over resamples.  A pool with no gold and no predicted code has F1 0
    (sklearn's zero_division=0); it can only arise in a resample, the full corpus is checked.
    """
    tp, fp, fn = (np.asarray(x, dtype=float) for x in (tp, fp, fn))
    denominator = 2.0 * tp + fp + fn
    return np.divide(2.0 * tp, denominator, out=np.zeros_like(denominator), where=denominator > 0)


CorpusMetric = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _pooled_metric(counts: NoteCounts, metric: CorpusMetric) -> float:
    totals = counts.matrix().sum(axis=0)
    if 2 * totals[0] + totals[1] + totals[2] == 0:
        raise StatsInputError("corpus has no gold and no predicted codes: micro-F1 undefined")
    return float(metric(totals[0], totals[1], totals[2]))


def _resampled_metric(matrices: list[np.ndarray], metric: CorpusMetric, n_resamples: int, seed: int):
    n = matrices[0].shape[0]
    out = [[] for _ in matrices]
    for counts in resample_count_batches(n, n_resamples, seed):
        for slot, matrix in zip(out, matrices):
            pooled = counts @ matrix  # (rows, 3): tp, fp, fn summed over the drawn notes
            slot.append(metric(pooled[:, 0], pooled[:, 1], pooled[:, 2]))
    return [np.concatenate(slot) for slot in out]


def corpus_bootstrap(
    counts: NoteCounts,
    *,
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    metric: CorpusMetric = micro_f1,
) -> Interval:
    """Corpus-level metric (micro-F1 by default) with notes resampled (App. K, Table 43).

    Each resample draws notes with replacement, pools their tp/fp/fn and recomputes the
    metric: a different estimand from the mean of per-note F1.
    """
    if not isinstance(counts, NoteCounts):
        raise StatsInputError("counts must be a NoteCounts(tp, fp, fn)")
    n_resamples = as_count(n_resamples, "n_resamples")
    seed = as_seed(seed)
    confidence = as_confidence(confidence)
    estimate = _pooled_metric(counts, metric)
    (replicates,) = _resampled_metric([counts.matrix()], metric, n_resamples, seed)
    low, high = _percentiles(replicates, confidence)
    return Interval(
        estimate=estimate,
        low=float(low),
        high=float(high),
        confidence=confidence,
        n=counts.n,
        n_resamples=n_resamples,
        seed=seed,
        statistic=(
            f"corpus-level {getattr(metric, '__name__', 'metric')}, notes resampled, percentile "
            f"bootstrap {confidence:.0%} ({n_resamples} resamples, seed {seed})"
        ),
    )


def paired_corpus_bootstrap_difference(
    counts_a: NoteCounts,
    counts_b: NoteCounts,
    *,
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    metric: CorpusMetric = micro_f1,
) -> Interval:
    """metric(a) - metric(b) on the same notes, both arms pooled over the same resample (Table 43).

    `boot_corpus_f1.py`: 10,000 resamples of the notes, seed 0.  Note order must match.
    """
    return seed_matched_corpus_bootstrap_difference(
        [(counts_a, counts_b)], n_resamples=n_resamples, seed=seed, confidence=confidence, metric=metric
    )


def seed_matched_corpus_bootstrap_difference(
    seed_pairs,
    *,
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
    metric: CorpusMetric = micro_f1,
) -> Interval:
    """Corpus-level metric difference over seed-matched runs, notes resampled (Sec. 4.3, Table 43).

    `seed_pairs` lists (arm run, reference run) NoteCounts on the same notes, seed i against
    seed i (`clustered.matched_seed_pairs`).  The estimate and each resample are the mean over
    the pairs of metric(arm) - metric(reference), every run pooled over the same drawn notes:
    the corpus-level difference "over the three seed pairs" of the paper.  One pair is the plain
    paired corpus bootstrap.
    """
    seed_pairs = list(seed_pairs)
    if not seed_pairs:
        raise StatsInputError("seed_pairs: at least one (arm, reference) pair of NoteCounts")
    for i, pair in enumerate(seed_pairs):
        if len(pair) != 2 or not all(isinstance(c, NoteCounts) for c in pair):
            raise StatsInputError(f"seed_pairs[{i}] must be an (arm, reference) pair of NoteCounts")
    n_notes = {c.n for pair in seed_pairs for c in pair}
    if len(n_notes) != 1:
        raise StatsInputError(f"paired runs cover different note counts: {sorted(n_notes)}")
    n_resamples = as_count(n_resamples, "n_resamples")
    seed = as_seed(seed)
    confidence = as_confidence(confidence)
    estimate = float(np.mean([_pooled_metric(a, metric) - _pooled_metric(b, metric) for a, b in seed_pairs]))
    replicates = _resampled_metric([c.matrix() for pair in seed_pairs for c in pair], metric, n_resamples, seed)
    differences = np.mean([replicates[2 * i] - replicates[2 * i + 1] for i in range(len(seed_pairs))], axis=0)
    low, high = _percentiles(differences, confidence)
    pairs = f", mean over {len(seed_pairs)} seed pairs" if len(seed_pairs) > 1 else ""
    return Interval(
        estimate=estimate,
        low=float(low),
        high=float(high),
        confidence=confidence,
        n=n_notes.pop(),
        n_resamples=n_resamples,
        seed=seed,
        statistic=(
            f"difference of corpus-level {getattr(metric, '__name__', 'metric')}{pairs}, notes resampled, "
            f"percentile bootstrap {confidence:.0%} ({n_resamples} resamples, seed {seed})"
        ),
    )
