"""Bad input raises a clear StatsInputError (a UserError and a ValueError), never a number."""

import numpy as np
import pytest

from mistill.errors import UserError
from mistill.stats import (
    NoteCounts,
    align_by_note,
    benjamini_hochberg,
    bootstrap_column_means,
    bootstrap_mean,
    corpus_bootstrap,
    head_discoveries,
    knock_in_recovery,
    median_of_note_means,
    note_clustered_comparison,
    one_sample_t_tests,
    paired_bootstrap_mean_difference,
    paired_comparison,
    paired_corpus_bootstrap_difference,
    pooled_weights,
    recurrence_test,
    sign_test,
    spearman_over_heads,
    split_half_stability,
    top_k_overlap,
    wilcoxon_signed_rank,
)
from mistill.stats.checks import StatsInputError

NAN = float("nan")
GOOD = [0.1, 0.2, -0.3, 0.4]

MISMATCHED = [
    ("paired_bootstrap", lambda: paired_bootstrap_mean_difference(GOOD, GOOD[:3], seed=0)),
    ("paired_comparison", lambda: paired_comparison(GOOD, GOOD[:3], seed=0)),
    ("wilcoxon", lambda: wilcoxon_signed_rank(GOOD, GOOD[:3])),
    ("sign", lambda: sign_test(GOOD, GOOD[:3])),
    ("spearman", lambda: spearman_over_heads(GOOD, GOOD[:3])),
    ("top_k_overlap", lambda: top_k_overlap(GOOD, GOOD[:3], 2)),
    ("clustered", lambda: note_clustered_comparison({0: GOOD}, {0: GOOD[:3]}, seed=0)),
    ("knock_in", lambda: knock_in_recovery(GOOD, GOOD, GOOD[:3])),
    ("note_ids", lambda: median_of_note_means(GOOD, ["a", "b"])),
    (
        "corpus_pair",
        lambda: paired_corpus_bootstrap_difference(
            NoteCounts([1, 2], [0, 1], [1, 0]), NoteCounts([1], [0], [1]), n_resamples=10
        ),
    ),
    ("counts", lambda: NoteCounts([1, 2], [0, 1], [1])),
    ("bh_signs", lambda: benjamini_hochberg([0.01, 0.2], signs=[1.0])),
    ("split_half", lambda: split_half_stability(np.zeros((4, 10)), ["a", "b", "c"], ks=(2,), full_k=2)),
]

WITH_NAN = [
    ("bootstrap", lambda: bootstrap_mean([0.1, NAN, 0.3], seed=0)),
    ("columns", lambda: bootstrap_column_means([[0.1, 0.2], [NAN, 0.1]], seed=0)),
    ("paired_bootstrap", lambda: paired_bootstrap_mean_difference([0.1, 0.2], [NAN, 0.1], seed=0)),
    ("wilcoxon", lambda: wilcoxon_signed_rank([0.1, NAN, 0.2])),
    ("sign", lambda: sign_test([0.1, NAN, 0.2])),
    ("t_tests", lambda: one_sample_t_tests([[0.1, 0.2], [NAN, 0.1], [0.3, 0.3]])),
    ("head_discoveries", lambda: head_discoveries([[0.1, 0.2], [NAN, 0.1], [0.3, 0.3]])),
    ("bh", lambda: benjamini_hochberg([0.01, NAN])),
    ("recurrence", lambda: recurrence_test([[0.1, NAN, 0.3]], 1)),
    ("weights", lambda: pooled_weights([0.3, NAN, 0.1], 2)),
    ("clustered", lambda: note_clustered_comparison({0: [0.1, NAN]}, {0: [0.1, 0.2]}, seed=0)),
    ("knock_in", lambda: knock_in_recovery([0.1, NAN], [0.0, 0.0], [2.0, 2.0])),
    ("median_notes", lambda: median_of_note_means([0.1, NAN], ["a", "b"])),
    ("counts", lambda: NoteCounts([1, NAN], [0, 1], [1, 0])),
    ("inf", lambda: bootstrap_mean([0.1, np.inf], seed=0)),
]

EMPTY = [
    ("bootstrap", lambda: bootstrap_mean([], seed=0)),
    ("paired_bootstrap", lambda: paired_bootstrap_mean_difference([], [], seed=0)),
    ("wilcoxon", lambda: wilcoxon_signed_rank([], [])),
    ("sign", lambda: sign_test([])),
    ("t_tests", lambda: one_sample_t_tests(np.zeros((0, 3)))),
    ("bh", lambda: benjamini_hochberg([])),
    ("clustered_no_seeds", lambda: note_clustered_comparison({}, {0: GOOD}, seed=0)),
    ("clustered_no_notes", lambda: note_clustered_comparison({0: []}, {0: []}, seed=0)),
    ("corpus", lambda: corpus_bootstrap(NoteCounts([], [], []))),
    ("median_notes", lambda: median_of_note_means([], [])),
    ("recurrence", lambda: recurrence_test(np.zeros((0, 5)), 2)),
    ("align", lambda: align_by_note({}, {})),
]

OTHER = [
    ("bh_fdr", lambda: benjamini_hochberg([0.01], fdr=1.5)),
    ("p_out_of_range", lambda: benjamini_hochberg([0.01, 1.2])),
    ("seed_none", lambda: bootstrap_mean(GOOD, seed=None)),
    ("seed_negative", lambda: bootstrap_mean(GOOD, seed=-1)),
    ("zero_resamples", lambda: bootstrap_mean(GOOD, seed=0, n_resamples=0)),
    ("confidence", lambda: bootstrap_mean(GOOD, seed=0, confidence=95)),
    ("negative_counts", lambda: NoteCounts([1, -1], [0, 1], [1, 0])),
    ("fractional_counts", lambda: NoteCounts([1, 0.5], [0, 1], [1, 0])),
    ("empty_corpus_metric", lambda: corpus_bootstrap(NoteCounts([0, 0], [0, 0], [0, 0]))),
    ("k_too_large", lambda: pooled_weights(GOOD, 5)),
    ("not_a_matrix", lambda: recurrence_test(GOOD, 2)),
    ("text", lambda: bootstrap_mean(["a", "b"], seed=0)),
    ("one_patient", lambda: split_half_stability(np.zeros((3, 5)), ["p", "p", "p"], ks=(2,), full_k=2)),
    ("align_differs", lambda: align_by_note({"a": 1.0, "b": 2.0}, {"a": 1.0, "c": 2.0})),
]


@pytest.mark.parametrize("case", MISMATCHED + WITH_NAN + EMPTY + OTHER, ids=lambda c: c[0])
def test_bad_input_raises_a_clear_error(case):
    _, call = case
    with pytest.raises(StatsInputError) as info:
        call()
    message = str(info.value)
    assert message and "\n" not in message  # one line the CLI can print
    assert isinstance(info.value, UserError) and isinstance(info.value, ValueError)


def test_error_messages_name_the_problem():
    with pytest.raises(StatsInputError, match="differ in shape"):
        paired_bootstrap_mean_difference(GOOD, GOOD[:3], seed=0)
    with pytest.raises(StatsInputError, match="non-finite"):
        wilcoxon_signed_rank([0.1, NAN, 0.2])
    with pytest.raises(StatsInputError, match="empty"):
        bootstrap_mean([], seed=0)


def test_align_by_note_pairs_by_id_not_position():
    ids, a, b = align_by_note({"n2": 2.0, "n1": 1.0}, {"n1": 10.0, "n2": 20.0})
    assert ids == ["n1", "n2"]
    np.testing.assert_array_equal(a, [1.0, 2.0])
    np.testing.assert_array_equal(b, [10.0, 20.0])


def test_stats_params_read_both_profiles():
    from pathlib import Path

    from mistill.params import load_params
    from mistill.stats.config import StatsParams

    params_file = Path(__file__).resolve().parents[2] / "params.yaml"
    for profile in ("demo", "paper"):
        config = StatsParams.from_params(load_params(params_file, profile))
        assert (config.bootstrap_resamples, config.corpus_bootstrap_resamples) == (1000, 10_000)
        assert config.split_half_ks == (8, 40)
    with pytest.raises(UserError, match="unknown key"):
        StatsParams.from_params({"stats": {"bootstrap_resample": 10}})
