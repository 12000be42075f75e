"""Statistics over head rankings: recurrence, Spearman, top-k overlap, split-half
stability and carry, pooled weights, sparsity (App. C, App. D).

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


def _split_patients(patients: np.ndarray) -> np.ndarray:
    unique = np.unique(patients)
    if unique.size < 2:
        raise StatsInputError(f"split-half needs at least 2 patients, got {unique.size}")
    return unique


def patient_halves(patients: np.ndarray, n_splits: int, seed: int):
    """The random patient halves of App. D, as a boolean "in half A" over the notes, one per split.

    Each split draws `rng.permutation` (numpy default_rng(seed)) of the sorted patient ids; the
    first floor(P/2) form half A.  Every split-half statistic draws its halves here, so two
    statistics with the same patients, count and seed compare the same halves.
    """
    unique = _split_patients(patients)
    rng = np.random.default_rng(seed)
    for _ in range(n_splits):
        half_a = set(rng.permutation(unique)[: unique.size // 2].tolist())
        yield np.array([p in half_a for p in patients.tolist()])


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
    The halves are drawn by `patient_halves`.  Reported as medians over splits (Table 15).
    """
    values = as_values(per_note, "per_note", ndim=2)
    patients = as_labels(patient_ids, values.shape[0], "patient_ids")
    n_splits = as_count(n_splits, "n_splits")
    seed = as_seed(seed)
    unique = _split_patients(patients)
    for k in (*ks, full_k):
        if as_count(k, "k") > values.shape[1]:
            raise StatsInputError(f"k = {k} exceeds the {values.shape[1]} heads")
    full = values.mean(axis=0)
    if np.ptp(values, axis=1).max() == 0:
        raise StatsInputError("per_note: every note is constant over heads; no ranking to compare")
    full_top = set(top_k(full, full_k).tolist())
    rhos = np.empty(n_splits)
    overlap = {k: np.empty(n_splits, dtype=int) for k in ks}
    full_overlap = np.empty((n_splits, 2), dtype=int)
    for split, in_a in enumerate(patient_halves(patients, n_splits, seed)):
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


def exact_merged(first_order, patches) -> np.ndarray:
    """One note's exact-merged importance: raw I exact where patched, first-order elsewhere (App. D, Table 13).

    first_order: (n_events, n_heads) the first-order I of the note's events of one phase;
    patches: one entry per event, None where the event was not patched, else (heads, exact):
    flat head indices and their exact I (mean-ablated alone).  Each patched event's vector is
    its first-order vector with the patched heads' entries replaced by their exact effects;
    the note's value is the mean over its patched events.  A head patched at none of them
    keeps the mean of its first-order I over those events; an event with no patches does
    not enter (as the knock-in pass's refinement, `knockin.exact_refinement`, averages).
    """
    first = as_values(first_order, "first_order", ndim=2)
    if len(patches) != first.shape[0]:
        raise StatsInputError(f"patches: {len(patches)} entries for {first.shape[0]} events")
    merged = []
    for vector, patch in zip(first, patches):
        if patch is None:
            continue
        heads, exact = np.asarray(patch[0], dtype=int), as_values(patch[1], "exact")
        if heads.shape != exact.shape:
            raise StatsInputError(f"patch: {heads.size} heads for {exact.size} exact effects")
        if heads.min() < 0 or heads.max() >= first.shape[1]:
            raise StatsInputError(f"patch: a head index outside the {first.shape[1]} heads")
        vector = vector.copy()
        vector[heads] = exact
        merged.append(vector)
    if not merged:
        raise StatsInputError("no event of the note was patched exactly; no exact-merged importance")
    return np.mean(merged, axis=0)


def top_k_carry(chosen_by, importance, k: int) -> float:
    r"""The share of `importance`'s best k that the top-k by `chosen_by` carries (App. D "Stability").

        carry = sum_{h in top_k(chosen_by)} importance_h / sum_{h in top_k(importance)} importance_h

    At most 1 whatever chooses (no k heads sum to more than the best k), 1 when the two top-k
    coincide.  Undefined unless the best k sum to a positive importance.
    """
    chooser, values = as_pair(chosen_by, importance, ("chosen_by", "importance"))
    best = float(values[top_k(values, k)].sum())
    if best <= 0:
        raise StatsInputError(f"importance: its best {k} heads sum to {best:g}; no share of it to carry")
    return float(values[top_k(chooser, k)].sum()) / best


@dataclass(frozen=True)
class SplitHalfCarry:
    """Each patient half's top-k read on the other half's importance (App. D, "Stability")."""

    by_ranking: np.ndarray  # (n_splits, 2): top-k chosen by the half's `ranking`; A's on B, then B's on A
    by_importance: np.ndarray  # (n_splits, 2): top-k chosen by the half's own `importance`
    median_by_ranking: float  # over both directions of every split
    median_by_importance: float
    k: int
    n_splits: int
    seed: int
    n_patients: int
    n_notes: int


def split_half_carry(
    ranking,
    importance,
    patient_ids,
    *,
    k: int = 8,
    n_splits: int = 200,
    seed: int = 0,
) -> SplitHalfCarry:
    """How much of the other half's own best k a half's top-k carries, over random patient halves (App. D).

    ranking, importance: (n_notes, n_heads), row by row the same notes.  ranking is what a
    half's set is chosen by (the per-note calibrated I_c of the contrast ranking), importance
    what the set carries (the per-note exact-merged I, `exact_merged`); a half's value of
    either is its notes' mean, as `split_half_stability` ranks.  The halves are drawn by
    `patient_halves`, so under the same patients, count and seed they are the splits
    `split_half_stability` compares.  For each split and direction, choosing half X, carrying on Y:

        carry = top_k_carry(chosen_by = X's mean ranking or X's mean importance, Y's mean importance, k)

    The set chosen by X's own importance is the best X can pick for X, not for Y: out of
    sample it may carry less than the set the ranking picks.  Reported as medians over both
    directions of every split.
    """
    chooser, values = as_pair(ranking, importance, ("ranking", "importance"), ndim=2)
    patients = as_labels(patient_ids, values.shape[0], "patient_ids")
    n_splits = as_count(n_splits, "n_splits")
    seed = as_seed(seed)
    unique = _split_patients(patients)
    if as_count(k, "k") > values.shape[1]:
        raise StatsInputError(f"k = {k} exceeds the {values.shape[1]} heads")
    by_ranking = np.empty((n_splits, 2))
    by_importance = np.empty((n_splits, 2))
    for split, in_a in enumerate(patient_halves(patients, n_splits, seed)):
        halves = (in_a, ~in_a)
        for side, (chosen, other) in enumerate((halves, halves[::-1])):
            carried = values[other].mean(axis=0)
            by_ranking[split, side] = top_k_carry(chooser[chosen].mean(axis=0), carried, k)
            by_importance[split, side] = top_k_carry(values[chosen].mean(axis=0), carried, k)
    return SplitHalfCarry(
        by_ranking=by_ranking,
        by_importance=by_importance,
        median_by_ranking=float(np.median(by_ranking)),
        median_by_importance=float(np.median(by_importance)),
        k=int(k),
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
