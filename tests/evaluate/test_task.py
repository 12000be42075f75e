"""Task metrics against sklearn, a direct PSP implementation and hand-worked values."""

import math
from collections import Counter

import numpy as np
import pytest
from sklearn.metrics import f1_score
from sklearn.preprocessing import MultiLabelBinarizer

from mistill.evaluate import task

GOLD = [["A01.1", "B02.2", "C03.3"], ["A01.1"], ["D04.4", "E05.5"], ["B02.2", "F06.6"]]
PRED = [["B02.2", "A01.1", "Z99.9"], [], ["E05.5", "E05.5", "D04.4", "A01.1"], ["F06.6"]]


def _indicator(pred, gold, labels):
    mlb = MultiLabelBinarizer(classes=labels)
    return mlb.fit_transform(gold), mlb.transform(pred)


def test_micro_macro_match_sklearn():
    labels = task.code_universe(PRED, GOLD)
    y_true, y_pred = _indicator(PRED, GOLD, labels)
    assert task.micro_f1(PRED, GOLD) == pytest.approx(f1_score(y_true, y_pred, average="micro"))
    assert task.macro_f1(PRED, GOLD) == pytest.approx(f1_score(y_true, y_pred, average="macro", zero_division=0))


def test_micro_macro_match_sklearn_random():
    rng = np.random.default_rng(0)
    codes = [f"X{i:02d}.0" for i in range(30)]
    gold = [list(rng.choice(codes, rng.integers(1, 6), replace=False)) for _ in range(40)]
    pred = [list(rng.choice(codes, rng.integers(0, 8), replace=False)) for _ in range(40)]
    labels = task.code_universe(pred, gold)
    y_true, y_pred = _indicator(pred, gold, labels)
    assert task.micro_f1(pred, gold) == pytest.approx(f1_score(y_true, y_pred, average="micro"))
    assert task.macro_f1(pred, gold) == pytest.approx(f1_score(y_true, y_pred, average="macro", zero_division=0))
    sub = labels[:7]
    yt, yp = _indicator(pred, gold, sub)
    assert task.macro_f1(pred, gold, sub) == pytest.approx(f1_score(yt, yp, average="macro", zero_division=0))


def test_micro_hand_worked():
    # TP: A,B (note 0), D,E (note 2), F (note 3) = 5; FP: Z, A(note 2) = 2; FN: C, A(note 1), B(note 3) = 3
    assert task.micro_f1(PRED, GOLD) == pytest.approx(10 / 15)


def test_precision_at_k_emission_order():
    gold = [["A", "B"]]
    assert task.precision_at_k([["Z", "A", "B"]], gold, 2) == pytest.approx(0.5)  # first two: Z, A
    assert task.precision_at_k([["A", "A", "B"]], gold, 2) == pytest.approx(1.0)  # repeat counts once
    assert task.precision_at_k([["A"]], gold, 8) == pytest.approx(1 / 8)  # short answers penalised
    assert task.recall_at_k([["Z", "A", "B"]], gold, 2) == pytest.approx(0.5)


def _jain_direct(freq, n, a=0.55, b=1.5):
    c = (np.log(n) - 1) * (b + 1) ** a
    return 1.0 / (1.0 + c * np.exp(-a * np.log(freq + b)))


def test_psp_against_direct_jain_formula():
    rng = np.random.default_rng(1)
    codes = [f"Y{i:02d}.1" for i in range(25)]
    train = [list(rng.choice(codes, rng.integers(1, 5), replace=False)) for _ in range(200)]
    gold = [list(rng.choice(codes, rng.integers(1, 6), replace=False)) for _ in range(30)]
    pred = [list(rng.choice(codes, rng.integers(0, 18), replace=False)) for _ in range(30)]
    n = len(train)
    freq = Counter(c for row in train for c in set(row))
    k = 15
    # Direct: PSP@k = (1/k) sum_{l in top-k} y_l / p_l over max achievable, per note, mean over notes.
    ratios = []
    for p, t in zip(pred, gold):
        inv = {c: 1 / _jain_direct(freq.get(c, 0), n) for c in codes}
        num = sum(inv[c] for c in p[:k] if c in t) / k
        den = sum(sorted((inv[c] for c in t), reverse=True)[:k]) / k
        ratios.append(num / den)
    got = task.task_metrics(pred, gold, [True] * len(pred), train)["psp_at_15"]
    assert got == pytest.approx(np.mean(ratios))
    assert task.jain_propensity(0, n) == pytest.approx(_jain_direct(0, n))


def test_psp_perfect_and_rare_label_weighting():
    prop = {"common": 0.9, "rare": 0.1}
    assert task.psp_at_k([["rare", "common"]], [["rare", "common"]], prop, 15) == pytest.approx(1.0)
    # Hitting only the rare label earns 10/(10+1.11) of the best; only the common one 1.11/(11.11).
    assert task.psp_at_k([["rare"]], [["rare", "common"]], prop, 15) == pytest.approx(10 / (10 + 1 / 0.9))
    assert task.psp_at_k([["common"]], [["rare", "common"]], prop, 15) == pytest.approx((1 / 0.9) / (10 + 1 / 0.9))


def test_head_tail_split_at_median_training_frequency():
    train_freq = Counter({"A01.1": 10, "B02.2": 5, "C03.3": 1, "D04.4": 0, "E05.5": 7, "F06.6": 2})
    head, tail = task.head_tail_labels(GOLD, train_freq)
    # frequencies of gold labels: 10,5,1,0,7,2 -> median 3.5
    assert head == ["A01.1", "B02.2", "E05.5"] and tail == ["C03.3", "D04.4", "F06.6"]
    out = task.head_tail_macro_f1(PRED, GOLD, train_freq)
    y_true, y_pred = _indicator(PRED, GOLD, tail)
    assert out["tail_macro_f1"] == pytest.approx(f1_score(y_true, y_pred, average="macro", zero_division=0))


def test_valid_rate_and_length_mismatch():
    assert task.valid_rate([True, False, True, True]) == 0.75
    with pytest.raises(ValueError):
        task.micro_f1([["A"]], [["A"], ["B"]])
    assert math.isclose(task.note_f1([], []), 1.0)
