"""mistill.stats: the one statistics library every reader uses (App. C, D, K, L).

bootstrap  percentile bootstrap over notes; corpus-level metric bootstrap (micro-F1)
paired     Wilcoxon signed-rank (zeros dropped), sign test, one-sample t-tests
clustered  note-clustered, seed-matched comparison of two arms
multiple   Benjamini-Hochberg with signed discovery counts; Bonferroni; t-tests -> BH
heads      recurrence, Spearman, top-k overlap, split-half stability, pooled weights, sparsity
effects    knock-in recovery, necessity, gap recovered, medians over notes of per-note means
config     StatsParams: the params.yaml `stats` section
checks     input validation: bad input raises StatsInputError (a UserError and a ValueError)
"""

from mistill.stats.bootstrap import (
    ColumnIntervals,
    Interval,
    NoteCounts,
    bootstrap_column_means,
    bootstrap_mean,
    corpus_bootstrap,
    micro_f1,
    paired_bootstrap_mean_difference,
    paired_corpus_bootstrap_difference,
    seed_matched_corpus_bootstrap_difference,
)
from mistill.stats.checks import StatsInputError, align_by_note
from mistill.stats.clustered import mean_over_seeds, note_clustered_comparison
from mistill.stats.config import StatsParams
from mistill.stats.effects import (
    gap_recovered,
    knock_in_recovery,
    mean_of_note_means,
    median_of_note_means,
    necessity,
)
from mistill.stats.heads import (
    heads_carrying_share,
    noise_floor,
    pooled_weights,
    recurrence_test,
    spearman_over_heads,
    split_half_stability,
    top_k_overlap,
)
from mistill.stats.multiple import benjamini_hochberg, bonferroni, head_discoveries
from mistill.stats.paired import one_sample_t_tests, paired_comparison, sign_test, wilcoxon_signed_rank

__all__ = [
    "ColumnIntervals",
    "Interval",
    "NoteCounts",
    "StatsInputError",
    "StatsParams",
    "align_by_note",
    "benjamini_hochberg",
    "bonferroni",
    "bootstrap_column_means",
    "bootstrap_mean",
    "corpus_bootstrap",
    "gap_recovered",
    "head_discoveries",
    "heads_carrying_share",
    "knock_in_recovery",
    "mean_of_note_means",
    "mean_over_seeds",
    "median_of_note_means",
    "micro_f1",
    "necessity",
    "noise_floor",
    "note_clustered_comparison",
    "one_sample_t_tests",
    "paired_bootstrap_mean_difference",
    "paired_comparison",
    "paired_corpus_bootstrap_difference",
    "pooled_weights",
    "recurrence_test",
    "seed_matched_corpus_bootstrap_difference",
    "sign_test",
    "spearman_over_heads",
    "split_half_stability",
    "top_k_overlap",
    "wilcoxon_signed_rank",
]
