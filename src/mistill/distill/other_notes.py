"""Teacher targets taken from other notes: a mutant of the Mistill recipe (`mistill.repro.mutants`).

A Mistill note is supervised towards its own teacher's pooled bucket attention (rows over the note's
span buckets), region mass m and contribution c at its own events.  This mutant keeps every note's
own events, rows and buckets (its `event_index` and window distances) and fills them with another
note's values, the donor given by a seeded derangement of the training notes (no note keeps its own):

    rows_i[r]  = fit(rows_d[r mod n_d], B_i)      fit: cut or zero-pad the bucket axis to the note's B_i,
                                                  then rescale to the row's own mass
    m_i[e], c_i[e] = m_d[e mod n_d], c_d[e mod n_d]

for each phase (P1, P2, P2C) and the P1 window rows, d the donor, n_d its count of rows (events) of
that part.  A part the donor lacks keeps the note's own values.  What the student is asked to attend
to then no longer belongs to its note, so a check that cannot tell this run from Mistill cannot tell
whether the attention targets matter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def derangement(n: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly drawn permutation of range(n) with no fixed point (n >= 2), by rejection."""
    if n < 2:
        raise ValueError(f"a derangement needs at least 2 items, got {n}")
    while True:
        order = rng.permutation(n)
        if not (order == np.arange(n)).any():
            return order


def fit_rows(donor: np.ndarray, own: np.ndarray) -> np.ndarray:
    """The donor's rows [n_d, B_d] cycled to the note's row count and cut or zero-padded to its B, each
    row rescaled to the mass of the note's own row (a row of zero mass after the cut stays zero)."""
    n, width = own.shape
    rows = donor[np.arange(n) % len(donor)][:, :width]
    if rows.shape[1] < width:
        rows = np.pad(rows, ((0, 0), (0, width - rows.shape[1])))
    mass = rows.sum(axis=1, keepdims=True)
    scale = np.divide(own.sum(axis=1, keepdims=True), mass, out=np.zeros_like(mass), where=mass > 0)
    return (rows * scale).astype(own.dtype)


def borrowed(own: Mapping[str, np.ndarray], donor: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """One part's arrays (rows, m, c, event_index, distance) with the donor's values in the note's shape."""
    if not donor or not len(donor["rows"]) or not len(own["rows"]):
        return dict(own)
    out = dict(own)
    out["rows"] = fit_rows(np.asarray(donor["rows"]), np.asarray(own["rows"]))
    for key in ("m", "c"):
        if key in own:
            values = np.asarray(donor[key])
            out[key] = values[np.arange(len(own[key])) % len(values)].astype(np.asarray(own[key]).dtype)
    return out


def targets_of_other_notes(notes: Sequence, seed: int) -> list[str]:
    """Give every note (objects with a `teacher` dict: part -> arrays) another note's teacher targets, in
    place; returns each note's donor id in order."""
    order = derangement(len(notes), np.random.default_rng(seed))
    originals = [note.teacher for note in notes]
    for note, donor in zip(notes, order):
        note.teacher = {part: borrowed(arrays, originals[donor].get(part)) for part, arrays in note.teacher.items()}
    return [notes[d].note_id for d in order]
