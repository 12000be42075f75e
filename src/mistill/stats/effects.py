"""Effect sizes and their aggregation over notes (Sec. 2.3, App. C, App. K).

- Knock-in recovery per event, R = (m_set - m_corr) / (m_all - m_corr), counted only
  where the range m_all - m_corr clears the 1-nat gate (App. C, App. I).
- Necessity per event, (m_clean - m_ablated) / m_clean (App. C).
- Per-note means, then the median over notes (App. C "Statistics": necessity is a ratio
  to the clean margin, unstable where it is near zero, so medians are reported).
- Gap to the teacher recovered, (arm - base) / (teacher - base) (App. K).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mistill.stats.checks import StatsInputError, as_labels, as_values


@dataclass(frozen=True)
class Recovery:
    """Per-event knock-in recovery; events failing the range gate carry no value."""

    recovery: np.ndarray  # one per event that passes the gate, in event order
    passed: np.ndarray  # bool per input event
    n_events: int
    n_passed: int
    min_range: float

    @property
    def pass_rate(self) -> float:
        return self.n_passed / self.n_events


@dataclass(frozen=True)
class NoteSummary:
    """A summary over notes of per-note means (the paper's unit is the note)."""

    estimate: float
    note_ids: tuple
    note_means: np.ndarray
    n_notes: int
    n_values: int
    statistic: str


def gap_recovered(arm: float, base: float, teacher: float) -> float:
    """Share of the base-to-teacher gap an arm closes: (arm - base) / (teacher - base) (App. K)."""
    arm, base, teacher = (
        float(as_values([x], name)[0]) for x, name in ((arm, "arm"), (base, "base"), (teacher, "teacher"))
    )
    if teacher == base:
        raise StatsInputError(f"teacher and base are equal ({teacher}); the gap is zero")
    return (arm - base) / (teacher - base)


def knock_in_recovery(margin_set, margin_corr, margin_all, *, min_range: float = 1.0) -> Recovery:
    """R = (margin_set - margin_corr) / (margin_all - margin_corr) per event (Sec. 2.3, App. C).

    margin_corr: the donor context with nothing knocked in; margin_all: every head knocked
    in (equals the clean margin); margin_set: the set knocked in.  An event counts only
    if margin_all - margin_corr >= min_range (the 1-nat range gate), so no ratio is taken
    over a vanishing range.
    """
    m_set = as_values(margin_set, "margin_set")
    m_corr = as_values(margin_corr, "margin_corr")
    m_all = as_values(margin_all, "margin_all")
    if not (m_set.shape == m_corr.shape == m_all.shape):
        raise StatsInputError(
            f"margin arrays differ in length: set {m_set.size}, corr {m_corr.size}, all {m_all.size}"
        )
    if not min_range > 0:
        raise StatsInputError(f"min_range must be positive, got {min_range!r}")
    span = m_all - m_corr
    passed = span >= min_range
    return Recovery(
        recovery=(m_set[passed] - m_corr[passed]) / span[passed],
        passed=passed,
        n_events=int(passed.size),
        n_passed=int(passed.sum()),
        min_range=float(min_range),
    )


def necessity(margin_clean, margin_ablated) -> np.ndarray:
    """(margin_clean - margin_ablated) / margin_clean per event (App. C).

    Unstable near a zero clean margin (hence medians over notes); an exactly zero clean
    margin has no ratio and is an error.
    """
    clean = as_values(margin_clean, "margin_clean")
    ablated = as_values(margin_ablated, "margin_ablated")
    if clean.shape != ablated.shape:
        raise StatsInputError(f"margin arrays differ in length: clean {clean.size}, ablated {ablated.size}")
    if (clean == 0).any():
        raise StatsInputError(
            f"{int((clean == 0).sum())} event(s) with a zero clean margin: necessity undefined"
        )
    return (clean - ablated) / clean


def note_means(values, note_ids) -> tuple[tuple, np.ndarray]:
    """Mean of the values of each note (events grouped by note id), notes in sorted order."""
    array = as_values(values, "values")
    labels = as_labels(note_ids, array.size, "note_ids")
    unique, inverse = np.unique(labels, return_inverse=True)
    sums = np.bincount(inverse, weights=array, minlength=unique.size)
    counts = np.bincount(inverse, minlength=unique.size)
    return tuple(unique.tolist()), sums / counts


def _summary(values, note_ids, reduce, name: str) -> NoteSummary:
    ids, means = note_means(values, note_ids)
    return NoteSummary(
        estimate=float(reduce(means)),
        note_ids=ids,
        note_means=means,
        n_notes=len(ids),
        n_values=int(np.asarray(values).size),
        statistic=f"{name} over notes of per-note means",
    )


def median_of_note_means(values, note_ids) -> NoteSummary:
    """median_n ( mean_{e in n} x_e ): the paper's reading of necessity and recovery (App. C)."""
    return _summary(values, note_ids, np.median, "median")


def mean_of_note_means(values, note_ids) -> NoteSummary:
    """mean_n ( mean_{e in n} x_e ): e.g. I_c, and quoted means of recovery (App. K)."""
    return _summary(values, note_ids, np.mean, "mean")
