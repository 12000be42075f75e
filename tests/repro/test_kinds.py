"""Kinds are read from whole words of a statistic, units first; every committed expected value has its kind."""

import pytest

from mistill.repro.registry import infer_kind, statistic_words


@pytest.mark.parametrize("name, value, stat, kind", [
    # a unit anywhere in the statistic, as a whole word: "percentile" is not "percent"
    ("p10_p1_margin", 9.72, "nats, 10th percentile", "nats"),
    ("p90_null_margin", -2.07, "nats, 90th percentile", "nats"),
    ("necessity_top8_p1_p10_p90", [1.28, 1.43], "10th-90th percentile over notes", "share"),
    ("first_mentions_that_are_siblings_of_earlier", 52.2, "percent of first mentions", "percent"),
    ("untrained_qwen_share_of_teacher", 107.2, "percent: untrained own top-k P2C recovery", "percent"),
    ("share_in_window", 31, "% of mentions", "percent"),
    # "%" elsewhere is not the unit
    ("own_p2c_k40_pair_intervals", [0.1, 0.3], "per-pair 95% CIs", "share"),
    ("criteria_thresholds", [90, 20, 2], "pre-fixed: >=90% notes beat random; >=20/40 overlap", "discrete"),
    # a quantity names the statistic itself, not what it is taken over
    ("smollm_vanilla_fp32_tail_macro_f1", 0.038, "macro-F1 over tail codes (training-split frequency)", "share"),
    ("shortlist_size", 207, "codes (+ category siblings of top 200)", "quantity"),
    ("median_trace_tokens", 1730, "median tokens (HD-002)", "quantity"),
    ("step_minutes", [3, 4], "minutes per 8-note step", "quantity"),
    # p-values, choices, counts and shares
    ("smollm_mistill_seed_diff_p", 0.93, "sign-test p", "p_value"),
    ("qwen_mistill_vs_bf16_p2c_sign_p", 0.029, "two-sided sign test over notes (Wilcoxon p 0.00444)", "p_value"),
    ("notes_necessity_above_random_p1_k3", 26, "count of 26 notes (sign test p=2.98e-08)", "count"),
    ("flip_layer", 24, "layer index (L24)", "discrete"),
    ("lambda_chosen", 0.5, "lambda_P1 = lambda_P2", "discrete"),
    ("p1_event_count", 2064, "count (31% of 1,365)", "count"),
    ("attr_vs_exact_corr_intact_graph", 0.84, "correlation over all 1,600 heads", "share"),
])
def test_kinds_hand_worked(name, value, stat, kind):
    assert infer_kind(name, value, stat) == kind


def test_statistic_words_are_whole_words_without_the_aside():
    assert statistic_words("nats, 10th percentile") == ["nats", "10th", "percentile"]
    assert statistic_words("macro-F1 over tail codes (training-split frequency), seed 0") == \
        ["macro-f1", "over", "tail", "codes"]


@pytest.mark.parametrize("profile", ["demo", "paper"])
def test_every_committed_value_has_the_kind_bless_would_give_it(registry, profile):
    """A paper value has the kind its statistic reads as; a demo golden the paper's kind for the same key
    (so both take the same default tolerance), else the kind its statistic reads as."""
    paper = registry.expected("paper").values
    wrong = []
    for rid, keys in registry.expected(profile).values.items():
        for key, exp in keys.items():
            reference = paper.get(rid, {}).get(key) if profile != "paper" else None
            kind = reference.kind if reference else infer_kind(key, exp.value, exp.stat)
            if exp.kind != kind:
                wrong.append(f"{rid}.{key}: {exp.kind}, reads as {kind}")
    assert wrong == []
