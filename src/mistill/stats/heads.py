"""Statistics over head rankings: recurrence, Spearman, top-k overlap, split-half
stability, pooled weights, sparsity (App. C, App. D).

A ranking is always by value, descending; ties are broken by head index (the flat
index layer * n_heads + head), so every ranking is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from mistill.stats.checks import StatsInputError, as_count, as_labels, as_pair, as_seed, as_values
from mistill.stats.multiple import Discoveries, bonferroni


def rank_heads(values) -> np.ndarray:
    """Head indices from highest to lowest value (stable: ties keep index order)."""
    array = as_values(values, "values")
    return np.argsort(-array, kind="stable")


def top_k(values, k: int) -> np.ndarray:
    array = as_values(values, "values")
    k = as_count(k, "k")
    if k > array.size:
        raise StatsInputError(f"k = {k} exceeds the {array.size} heads ranked")
    return rank_heads(array)[:k]


def top_k_overlap(a, b, k: int) -> int:
    """|top_k(a) ∩ top_k(b)|: heads shared by two rankings' top-k (App. C: "share 0 of their top-16")."""
    first, second = as_pair(a, b, ("a", "b"))
    return int(np.intersect1d(top_k(first, k), top_k(second, k)).size)


@dataclass(frozen=True)
class Spearman:
    rho: float
    p_value: float
    n: int


def spearman_over_heads(a, b) -> Spearman:
    """Spearman rank correlation of two per-head values over all heads (scipy.stats.spearmanr;
    ties get average ranks).  A constant ranking has no rank correlation: error."""
    first, second = as_pair(a, b, ("a", "b"), min_rows=3)
    for name, array in (("a", first), ("b", second)):
        if np.ptp(array) == 0:
            raise StatsInputError(f"{name}: constant over heads; Spearman correlation undefined")
    result = stats.spearmanr(first, second)
    return Spearman(float(result.statistic), float(result.pvalue), int(first.size))


@dataclass(frozen=True)
class Recurrence:
    """Per-head recurrence in the notes' top-k under a binomial null (App. D "Recurrence")."""

    counts: np.ndarray  # notes whose top-k holds the head
    p_value: np.ndarray  # one-sided binomial P(X >= count), X ~ Binomial(n_notes, top_k / n_heads)
    corrected: Discoveries  # Bonferroni over all heads
    n_recurrent: int
    expected_count: float  # n_notes * top_k / n_heads (1.25 in the paper)
    p_null: float
    n_notes: int
    top_k: int


def recurrence_test(per_note, top_k_per_note: int = 20, alpha: float = 0.05) -> Recurrence:
    """Binomial recurrence test per head with Bonferroni over all heads (App. D).

    per_note: (n_notes, n_heads) raw importance I (not NULL-calibrated).  If each note's
    top-k were a random draw of k of the H heads, a head's count would be
    Binomial(n_notes, k / H); a head is recurrent if its one-sided binomial test
    (scipy.stats.binomtest, alternative='greater') survives Bonferroni over the H heads.
    """
    values = as_values(per_note, "per_note", ndim=2)
    n_notes, n_heads = values.shape
    k = as_count(top_k_per_note, "top_k_per_note")
    if k > n_heads:
        raise StatsInputError(f"top_k_per_note = {k} exceeds the {n_heads} heads")
    counts = np.zeros(n_heads, dtype=int)
    for row in values:
        counts[rank_heads(row)[:k]] += 1
    p_null = k / n_heads
    p_values = np.array(
        [stats.binomtest(int(c), n_notes, p_null, alternative="greater").pvalue for c in counts]
    )
    corrected = bonferroni(p_values, alpha)
    return Recurrence(
        counts=counts,
        p_value=p_values,
        corrected=corrected,
        n_recurrent=corrected.n_discoveries,
        expected_count=n_notes * p_null,
        p_null=p_null,
        n_notes=n_notes,
        top_k=k,
    )


@dataclass(frozen=True)
class SplitHalfStability:
    """Rankings fitted on random patient halves against each other (App. D, Table 15)."""

    spearman: np.ndarray  # per split: Spearman over all heads, half A vs half B
    overlap: dict[int, np.ndarray]  # k -> per split |top_k(A) ∩ top_k(B)|
    full_overlap: np.ndarray  # (n_splits, 2): each half's top-full_k overlap with the full ranking
    median_spearman: float
    median_overlap: dict[int, float]
    median_full_overlap: float  # over both halves of every split
    full_k: int
    n_splits: int
    seed: int
    n_patients: int
    n_notes: int


def split_half_stability(
    per_note,
    patient_ids,
    *,
    n_splits: int = 200,
    seed: int = 0,
    ks: tuple[int, ...] = (8, 40),
    full_k: int = 40,
) -> SplitHalfStability:
    """Split patients into random halves `n_splits` times and rank heads on each half (App. D).

    per_note: (n_notes, n_heads) per-note I_c; a half's ranking is the mean over its
    notes (the same calibrated ranking as the full set).  Patients, not notes, are split,
    so a patient's two prompt variants never sit on both sides (App. A, App. C "Patients").
    Each split draws `rng.permutation` of the sorted patient ids; the first floor(P/2)
    form half A.  Reported as medians over splits (Table 15).
    """
    values = as_values(per_note, "per_note", ndim=2)
    patients = as_labels(patient_ids, values.shape[0], "patient_ids")
    n_splits = as_count(n_splits, "n_splits")
    seed = as_seed(seed)
    unique = np.unique(patients)
    if unique.size < 2:
        raise StatsInputError(f"split-half needs at least 2 patients, got {unique.size}")
    for k in (*ks, full_k):
        if as_count(k, "k") > values.shape[1]:
            raise StatsInputError(f"k = {k} exceeds the {values.shape[1]} heads")
    full = values.mean(axis=0)
    if np.ptp(values, axis=1).max() == 0:
        raise StatsInputError("per_note: every note is constant over heads; no ranking to compare")
    full_top = set(top_k(full, full_k).tolist())
    rng = np.random.default_rng(seed)
    rhos = np.empty(n_splits)
    overlap = {k: np.empty(n_splits, dtype=int) for k in ks}
    full_overlap = np.empty((n_splits, 2), dtype=int)
    for split in range(n_splits):
        half_a = set(rng.permutation(unique)[: unique.size // 2].tolist())
        in_a = np.array([p in half_a for p in patients.tolist()])
        mean_a, mean_b = values[in_a].mean(axis=0), values[~in_a].mean(axis=0)
        rhos[split] = stats.spearmanr(mean_a, mean_b).statistic
        for k in ks:
            overlap[k][split] = top_k_overlap(mean_a, mean_b, k)
        for side, mean in enumerate((mean_a, mean_b)):
            full_overlap[split, side] = len(full_top.intersection(top_k(mean, full_k).tolist()))
    return SplitHalfStability(
        spearman=rhos,
        overlap=overlap,
        full_overlap=full_overlap,
        median_spearman=float(np.median(rhos)),
        median_overlap={k: float(np.median(v)) for k, v in overlap.items()},
        median_full_overlap=float(np.median(full_overlap)),
        full_k=full_k,
        n_splits=n_splits,
        seed=seed,
        n_patients=int(unique.size),
        n_notes=int(values.shape[0]),
    )


@dataclass(frozen=True)
class PooledWeights:
    """Softmax pooling weights over a phase's top-k heads (App. C, App. I)."""

    heads: np.ndarray  # flat head indices, ranked by importance
    importance: np.ndarray  # I_c of those heads
    weights: np.ndarray  # sums to 1
    tau: float
    k: int
    ddof: int


def pooled_weights(importance, k: int, *, ddof: int = 0) -> PooledWeights:
    """w_h = softmax(I_c,h / tau) over the top-k heads by I_c, tau = s.d. of those k I_c (App. C).

    The paper does not say population or sample s.d.; ddof = 0 (population) by default.
    With tau = 0 (k = 1, or k equal importances) the weights are the uniform limit.
    """
    values = as_values(importance, "importance")
    if ddof not in (0, 1):
        raise StatsInputError(f"ddof must be 0 or 1, got {ddof!r}")
    heads = top_k(values, k)
    if ddof == 1 and heads.size < 2:
        raise StatsInputError("the sample s.d. (ddof = 1) needs k >= 2")
    chosen = values[heads]
    tau = float(np.std(chosen, ddof=ddof))
    if tau == 0.0:
        weights = np.full(chosen.size, 1.0 / chosen.size)
    else:
        logits = (chosen - chosen.max()) / tau  # shift for a stable softmax; weights unchanged
        weights = np.exp(logits) / np.exp(logits).sum()
    return PooledWeights(
        heads=heads, importance=chosen, weights=weights, tau=tau, k=int(heads.size), ddof=ddof
    )


def noise_floor(split_half_differences, quantile: float = 95.0) -> float:
    """App. D "Sparsity": the 95th percentile of |split-half NULL difference| (0.004 nats)."""
    values = as_values(np.ravel(np.asarray(split_half_differences, dtype=float)), "split_half_differences")
    if not 0.0 < quantile < 100.0:
        raise StatsInputError(f"quantile must lie in (0, 100), got {quantile!r}")
    return float(np.percentile(np.abs(values), quantile))


@dataclass(frozen=True)
class Concentration:
    n_above_floor: int
    n_carrying: int  # fewest heads above the floor whose importance sums to `share` of theirs
    share: float
    floor: float


def heads_carrying_share(importance, *, floor: float = 0.0, share: float = 0.8) -> Concentration:
    """App. D "Sparsity": of the heads with importance above `floor`, the fewest (largest first)
    that carry `share` of their summed importance (289 above the floor, 92 carry 80%)."""
    values = as_values(importance, "importance")
    if not 0.0 < share <= 1.0:
        raise StatsInputError(f"share must lie in (0, 1], got {share!r}")
    above = np.sort(values[values > floor])[::-1]
    if above.size == 0:
        return Concentration(0, 0, share, float(floor))
    cumulative = np.cumsum(above)
    # smallest n with cumulative[n-1] >= share * total (tolerance for float sums at share = 1)
    n_carrying = int(np.searchsorted(cumulative, share * cumulative[-1] * (1 - 1e-12)) + 1)
    return Concentration(int(above.size), min(n_carrying, int(above.size)), share, float(floor))
