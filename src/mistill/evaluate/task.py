"""Task metrics of Table 2 (App. K, "Task"): the students' answers against the gold codes.

Every metric takes, per note, the emitted codes **in emission order** (the parsed
JSON answer; an invalid generation scores as an empty answer) and the gold codes.

* micro-F1: true / false positives and false negatives pooled over notes.
* macro-F1: the mean per-label F1 over the **code universe** = the labels that occur
  in the gold sets or in the predictions (App. K).  A label outside the universe
  contributes nothing; pass `labels=` to fix another universe explicitly.
* head / tail macro-F1: the labels present in the gold sets are split at the median
  training-split frequency among them; tail = frequency <= median (App. K).
* P@k, R@k: the first k distinct emitted codes; precision divides by k, so short
  answers are penalised.
* PSP@k (Jain et al. 2016): with propensity p_l = 1 / (1 + C (N_l + B)^{-A}),
  C = (ln N - 1)(B + 1)^A, N the number of training notes, N_l the training frequency
  of label l, A = 0.55, B = 1.5:
      PSP@k(note) = (1/k) sum_{l in top-k} y_l / p_l,
  normalised by the best value achievable on the note, (1/k) sum of the k largest
  1/p_l over its gold labels; the reported value is the mean of the per-note ratios
  over notes with at least one gold label.
* PSnDCG@k: the same with the DCG discount 1/log2(rank + 1).
* valid rate: the share of generations whose answer parsed.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

JAIN_A = 0.55
JAIN_B = 1.5


def dedupe(codes: Iterable[str]) -> list[str]:
    """Emission order with repeats removed (a code counts once, at its first emission)."""
    seen: dict[str, None] = {}
    for code in codes:
        seen.setdefault(code, None)
    return list(seen)


def code_universe(predictions: Sequence[Sequence[str]], gold: Sequence[Sequence[str]]) -> list[str]:
    """App. K: labels that occur in the gold sets or the predictions, sorted."""
    return sorted({c for row in gold for c in row} | {c for row in predictions for c in row})


def _check_lengths(predictions: Sequence, gold: Sequence) -> None:
    if len(predictions) != len(gold):
        raise ValueError(f"{len(predictions)} predictions for {len(gold)} gold sets")


def per_label_counts(predictions, gold, labels):
    """tp, fp, fn per label of `labels` (arrays aligned with `labels`)."""
    _check_lengths(predictions, gold)
    index = {label: i for i, label in enumerate(labels)}
    tp = np.zeros(len(labels))
    fp = np.zeros(len(labels))
    fn = np.zeros(len(labels))
    for pred, true in zip(predictions, gold):
        p, t = set(pred), set(true)
        for c in p & t:
            if c in index:
                tp[index[c]] += 1
        for c in p - t:
            if c in index:
                fp[index[c]] += 1
        for c in t - p:
            if c in index:
                fn[index[c]] += 1
    return tp, fp, fn


def _f1(tp, fp, fn):
    denom = 2 * tp + fp + fn
    return np.divide(2 * tp, denom, out=np.zeros_like(np.asarray(tp, dtype=float)), where=denom > 0)


def micro_f1(predictions: Sequence[Sequence[str]], gold: Sequence[Sequence[str]]) -> float:
    """2 TP / (2 TP + FP + FN), counts pooled over notes."""
    labels = code_universe(predictions, gold)
    tp, fp, fn = per_label_counts(predictions, gold, labels)
    return float(_f1(tp.sum(), fp.sum(), fn.sum()))


def macro_f1(predictions, gold, labels: Sequence[str] | None = None) -> float:
    """Mean per-label F1 over `labels` (default: the code universe of App. K)."""
    labels = code_universe(predictions, gold) if labels is None else list(labels)
    if not labels:
        return 0.0
    tp, fp, fn = per_label_counts(predictions, gold, labels)
    return float(_f1(tp, fp, fn).mean())


def note_f1(pred: Sequence[str], true: Sequence[str]) -> float:
    """One note's F1 between two code sets; two empty sets agree perfectly (1.0)."""
    p, t = set(pred), set(true)
    if not p and not t:
        return 1.0
    return 2 * len(p & t) / (len(p) + len(t))


def training_frequencies(train_gold: Iterable[Sequence[str]]) -> Counter:
    """N_l: how many training notes carry each label."""
    return Counter(c for row in train_gold for c in set(row))


def head_tail_labels(gold: Sequence[Sequence[str]], train_freq: Counter) -> tuple[list[str], list[str]]:
    """Split the labels present in the gold sets at their median training frequency (tail: <= median)."""
    present = sorted({c for row in gold for c in row})
    if not present:
        return [], []
    median = float(np.median([train_freq.get(c, 0) for c in present]))
    head = [c for c in present if train_freq.get(c, 0) > median]
    tail = [c for c in present if train_freq.get(c, 0) <= median]
    return head, tail


def head_tail_macro_f1(predictions, gold, train_freq: Counter) -> dict[str, float]:
    head, tail = head_tail_labels(gold, train_freq)
    return {
        "head_macro_f1": macro_f1(predictions, gold, head) if head else float("nan"),
        "tail_macro_f1": macro_f1(predictions, gold, tail) if tail else float("nan"),
    }


def precision_at_k(predictions, gold, k: int) -> float:
    """Mean over notes of |first k emitted ∩ gold| / k."""
    _check_lengths(predictions, gold)
    if not predictions:
        return 0.0
    return float(np.mean([len(set(dedupe(p)[:k]) & set(t)) / k for p, t in zip(predictions, gold)]))


def recall_at_k(predictions, gold, k: int) -> float:
    """Mean over notes with gold codes of |first k emitted ∩ gold| / |gold|."""
    _check_lengths(predictions, gold)
    values = [len(set(dedupe(p)[:k]) & set(t)) / len(set(t)) for p, t in zip(predictions, gold) if t]
    return float(np.mean(values)) if values else 0.0


def jain_propensity(label_count: float, n_train: int, a: float = JAIN_A, b: float = JAIN_B) -> float:
    """Jain et al. 2016, Eq. for p_l: 1 / (1 + C (N_l + B)^{-A}), C = (ln N - 1)(B + 1)^A."""
    c = (math.log(n_train) - 1.0) * (b + 1.0) ** a
    return 1.0 / (1.0 + c * (label_count + b) ** (-a))


def propensities(train_freq: Counter, n_train: int, labels: Iterable[str],
                 a: float = JAIN_A, b: float = JAIN_B) -> dict[str, float]:
    """p_l for every label in `labels`; a label unseen in training has N_l = 0."""
    return {label: jain_propensity(train_freq.get(label, 0), n_train, a, b) for label in labels}


def _psp_note(pred: Sequence[str], true: Sequence[str], prop: dict[str, float], k: int, dcg: bool) -> float | None:
    truth = set(true)
    if not truth:
        return None
    discount = (lambda r: 1.0 / math.log2(r + 2)) if dcg else (lambda r: 1.0)
    got = sum(discount(r) / prop[c] for r, c in enumerate(dedupe(pred)[:k]) if c in truth)
    best_inv = sorted((1.0 / prop[c] for c in truth), reverse=True)[:k]
    best = sum(discount(r) * v for r, v in enumerate(best_inv))
    return got / best


def psp_at_k(predictions, gold, prop: dict[str, float], k: int) -> float:
    """Mean over notes of PSP@k / best achievable PSP@k (the 1/k factors cancel)."""
    _check_lengths(predictions, gold)
    values = [v for p, t in zip(predictions, gold) if (v := _psp_note(p, t, prop, k, False)) is not None]
    return float(np.mean(values)) if values else 0.0


def psndcg_at_k(predictions, gold, prop: dict[str, float], k: int) -> float:
    _check_lengths(predictions, gold)
    values = [v for p, t in zip(predictions, gold) if (v := _psp_note(p, t, prop, k, True)) is not None]
    return float(np.mean(values)) if values else 0.0


def valid_rate(valid: Sequence[bool]) -> float:
    return float(np.mean([bool(v) for v in valid])) if len(valid) else 0.0


def task_metrics(predictions: Sequence[Sequence[str]], gold: Sequence[Sequence[str]], valid: Sequence[bool],
                 train_gold: Sequence[Sequence[str]], *, ks: Sequence[int] = (8, 15),
                 a: float = JAIN_A, b: float = JAIN_B) -> dict[str, float]:
    """Table 2's external columns (plus recalls and PSnDCG) for one arm's answers on the test notes.

    Invalid generations must arrive as empty predictions; `valid` only feeds the valid rate.
    """
    _check_lengths(predictions, gold)
    freq = training_frequencies(train_gold)
    universe = code_universe(predictions, gold)
    prop = propensities(freq, len(train_gold), universe, a, b)
    out: dict[str, float] = {
        "micro_f1": micro_f1(predictions, gold),
        "macro_f1": macro_f1(predictions, gold),
        **head_tail_macro_f1(predictions, gold, freq),
        "valid_rate": valid_rate(valid),
    }
    for k in ks:
        out[f"p_at_{k}"] = precision_at_k(predictions, gold, k)
        out[f"r_at_{k}"] = recall_at_k(predictions, gold, k)
        out[f"psp_at_{k}"] = psp_at_k(predictions, gold, prop, k)
        out[f"psndcg_at_{k}"] = psndcg_at_k(predictions, gold, prop, k)
    return out


def per_note_f1(predictions, gold) -> list[float]:
    """The per-note value the paired tests use (App. L: a different estimand from corpus micro-F1)."""
    _check_lengths(predictions, gold)
    return [note_f1(p, t) for p, t in zip(predictions, gold)]
