"""Input checks shared by every estimator: bad input raises, it never yields a number.

A statistic computed over misaligned pairs, a NaN that numpy propagates silently, or
an empty note set would be written into a numbers file as if it were a result.  Every
public function in `mistill.stats` passes its inputs through these checks first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from mistill.errors import UserError


class StatsInputError(UserError, ValueError):
    """Input a statistic cannot be computed from (empty, non-finite, misaligned).

    A `UserError` (the CLI prints it as one line) and a `ValueError` (what numeric
    callers expect to catch).
    """


def as_values(values, name: str, *, ndim: int = 1, min_rows: int = 1) -> np.ndarray:
    """`values` as a finite float array of `ndim` dimensions with at least `min_rows` rows.

    Rows are notes (axis 0); a 2-D array holds one column per quantity (e.g. per head).
    """
    try:
        array = np.asarray(values, dtype=float)
    except (TypeError, ValueError) as err:
        raise StatsInputError(f"{name}: not numeric ({err})") from None
    if array.ndim != ndim:
        raise StatsInputError(f"{name}: expected a {ndim}-D array, got shape {array.shape}")
    if array.shape[0] < min_rows:
        what = "empty" if array.shape[0] == 0 else f"{array.shape[0]} rows"
        raise StatsInputError(f"{name}: {what}; need at least {min_rows} notes")
    if ndim == 2 and array.shape[1] == 0:
        raise StatsInputError(f"{name}: no columns")
    bad = ~np.isfinite(array)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise StatsInputError(
            f"{name}: {int(bad.sum())} non-finite value(s) (NaN or inf), first at index {first}; "
            "drop the notes that lack the quantity before computing the statistic"
        )
    return array


def as_pair(a, b, names: tuple[str, str] = ("a", "b"), *, ndim: int = 1, min_rows: int = 1):
    """Two finite arrays of identical shape, paired row by row (note by note)."""
    first = as_values(a, names[0], ndim=ndim, min_rows=min_rows)
    second = as_values(b, names[1], ndim=ndim, min_rows=min_rows)
    if first.shape != second.shape:
        raise StatsInputError(
            f"paired inputs differ in shape: {names[0]} {first.shape} vs {names[1]} {second.shape}"
        )
    return first, second


def as_seed(seed) -> int:
    """Seeds are explicit non-negative integers (never None: every interval must be reproducible)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise StatsInputError(f"seed must be a non-negative integer, got {seed!r}")
    return int(seed)


def as_count(value, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise StatsInputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def as_confidence(confidence: float) -> float:
    if not 0.0 < float(confidence) < 1.0:
        raise StatsInputError(f"confidence must lie in (0, 1), got {confidence!r}")
    return float(confidence)


def align_by_note(
    a: Mapping[str, float], b: Mapping[str, float], names: tuple[str, str] = ("a", "b")
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Pair two per-note mappings by note id; the note sets must be identical.

    Returns the sorted note ids and the two value arrays in that order.  Pairing by id,
    not by position, is what makes a paired test paired.
    """
    missing_b = sorted(set(a) - set(b))
    missing_a = sorted(set(b) - set(a))
    if missing_a or missing_b:
        raise StatsInputError(
            f"note sets differ: {len(missing_b)} note(s) only in {names[0]} (e.g. {missing_b[:3]}), "
            f"{len(missing_a)} only in {names[1]} (e.g. {missing_a[:3]})"
        )
    note_ids = sorted(a)
    first = as_values([a[n] for n in note_ids], names[0])
    second = as_values([b[n] for n in note_ids], names[1])
    return note_ids, first, second


def as_labels(labels: Sequence, n: int, name: str) -> np.ndarray:
    """One label (note id, patient id) per row."""
    array = np.asarray(labels)
    if array.ndim != 1 or array.shape[0] != n:
        raise StatsInputError(f"{name}: expected {n} labels, one per note, got shape {array.shape}")
    return array
