"""Trace-set bookkeeping: mention counts, micro-F1, the single-code baseline, the summary."""

from __future__ import annotations

import pytest
from sklearn.metrics import f1_score
from sklearn.preprocessing import MultiLabelBinarizer

from mistill.models.traces import code_mentions, mention_counts, micro_f1, most_frequent_code, summarize

CODES = ["N18.3", "N18.4", "E11.9", "I10"]


def test_code_mentions_at_token_boundaries():
    text = 'N18.4 no. then N18.3, not N18.30 or xN18.3; I10 and I109 ["N18.3"]'
    expected = [(0, "N18.4"), (text.index("N18.3,"), "N18.3"), (text.index("I10 "), "I10"),
                (text.index('"N18.3"') + 1, "N18.3")]
    assert code_mentions(text, CODES) == expected


def test_mention_counts_hand_worked():
    # N18.4 first (P1 + 3 P2 characters: 1, 8, 4), then N18.3 after its sibling (P2C), E11.9,
    # then N18.3 twice more and N18.4 again.  P2C pairs: (N18.3, N18.4) counted at the first
    # mention and the first repeat only; (N18.4, N18.3) at N18.4's repeat.
    text = "N18.4 x N18.3 y E11.9 z N18.3 N18.3 N18.4"
    counts = mention_counts(text, CODES)
    assert counts.mentions == 6
    assert counts.first_mentions == 3
    assert counts.p2_characters == 3 + 3 + 3
    assert counts.sibling_after == 3       # N18.3 (1st), N18.3 (2nd), N18.4 (repeat, after N18.3)
    assert counts.first_after_sibling == 1


def test_micro_f1_matches_sklearn():
    predicted = [["N18.3", "I10"], [], ["E11.9", "N18.4", "I10"]]
    gold = [["N18.3"], ["I10"], ["E11.9", "N18.3"]]
    binarizer = MultiLabelBinarizer(classes=CODES)
    expected = f1_score(binarizer.fit_transform(gold), binarizer.transform(predicted), average="micro")
    result = micro_f1(predicted, gold)
    assert result["micro_f1"] == pytest.approx(expected)
    assert (result["tp"], result["fp"], result["fn"]) == (2, 3, 2)


def test_single_code_baseline():
    assert most_frequent_code([["B", "A"], ["A"], ["C", "B"]]) == "A"
    assert most_frequent_code([["B"], ["A"]]) == "A"  # ties: the smallest code
    assert most_frequent_code([]) is None


def test_summary():
    records = [
        {"note_id": "a", "completion": "<think>N18.4 N18.3</think>[\"N18.3\"]", "valid": True, "hit_cap": False,
         "degenerate": False, "answer": ["N18.3"], "n_new_tokens": 20},
        {"note_id": "b", "completion": "<think>I10", "valid": False, "hit_cap": True, "degenerate": True,
         "answer": [], "n_new_tokens": 99},
    ]
    summary = summarize(records, {"a": ("N18.3",), "b": ("I10",)}, {"a": "train", "b": "test"},
                        {"a": CODES, "b": CODES}, "N18.3")
    assert summary["overall"]["valid_rate"] == 0.5 and summary["overall"]["hit_cap_share"] == 0.5
    assert summary["overall"]["teacher"]["micro_f1"] == pytest.approx(2 / 3)
    assert summary["test"]["teacher"]["micro_f1"] == 0.0
    # predicting N18.3 everywhere: tp 1 (a), fp 1 (b), fn 1 (b's I10) -> P = R = F1 = 1/2
    assert summary["overall"]["single_code_baseline"]["micro_f1"] == pytest.approx(1 / 2)
    assert summary["per_note"]["a"]["first_after_sibling"] == 1
    assert summary["notes_with_sibling_before_chosen"] == 1
