"""NULL calibration: decision-specific importance and its tests (Sec. 2.3, App. C "NULL events", App. D).

Per note and head, with I the importance of the attribution pass (exact where
measured, first-order elsewhere):

    I_c(note, phase) = mean_{events of the phase} I  -  mean_{NULL events} I

then averaged over the notes that have the phase.  Tests (App. C "Statistics"):
a two-sided one-sample t-test per head over the per-note values, then
Benjamini-Hochberg at the FDR over all heads, each discovery signed by its mean.
The same machinery on raw NULL importance declares many heads (the paper: 309
positive, 282 negative); on one half of each note's NULL events minus the other
it must declare none (the calibration check).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from mistill.instrument.events import DECISION_KINDS, note_rng
from mistill.stats import (
    head_discoveries,
    heads_carrying_share,
    noise_floor,
    recurrence_test,
    spearman_over_heads,
    top_k_overlap,
)


@dataclass
class NoteContrast:
    """One note's per-head means [L*H] (flattened), None where the note has no such events."""

    note_id: str
    raw: dict[str, np.ndarray | None]  # phase -> mean I over the note's events of that phase
    null: np.ndarray | None
    null_half_difference: np.ndarray | None  # mean I over NULL half A - half B
    counts: dict[str, int] = field(default_factory=dict)

    def contrast(self, phase: str) -> np.ndarray | None:
        raw = self.raw.get(phase)
        return None if raw is None or self.null is None else raw - self.null


def note_contrast(note_id: str, kinds: Sequence[str], importance: np.ndarray, *, seed: int) -> NoteContrast:
    """Per-note means from the attribution pass's [E, L, H] importances."""
    kinds = np.asarray(kinds)
    flat = importance.reshape(len(kinds), -1).astype(np.float64)
    raw = {p: (flat[kinds == p].mean(0) if (kinds == p).any() else None) for p in DECISION_KINDS}
    null_rows = flat[kinds == "NULL"]
    null = null_rows.mean(0) if len(null_rows) else None
    half = None
    if len(null_rows) >= 2:
        order = note_rng(seed, note_id + ":null-split").permutation(len(null_rows))
        a, b = order[: len(order) // 2], order[len(order) // 2:]
        half = null_rows[a].mean(0) - null_rows[b].mean(0)
    counts = {p: int((kinds == p).sum()) for p in (*DECISION_KINDS, "NULL")}
    return NoteContrast(note_id, raw, null, half, counts)


def _stack(rows: Sequence[np.ndarray | None]) -> tuple[np.ndarray, list[int]]:
    kept = [i for i, r in enumerate(rows) if r is not None]
    return (np.stack([rows[i] for i in kept]) if kept else np.zeros((0, 0))), kept


@dataclass
class Calibration:
    note_ids: list[str]
    ic_per_note: dict[str, np.ndarray]  # phase -> [notes with the phase, L*H]
    ic_notes: dict[str, list[str]]
    ic_mean: dict[str, np.ndarray]  # phase -> [L*H]
    summary: dict  # counts and correlations (JSON-ready)


def calibrate(notes: Sequence[NoteContrast], *, fdr: float = 0.05, top_k: int = 16, pool_k: int = 40,
              recurrence_top_k: int = 20) -> Calibration:
    """I_c per phase, BH discoveries, the raw-NULL and split-half checks, sparsity and recurrence."""
    summary: dict = {"n_notes": len(notes), "fdr": fdr, "phases": {}}
    ic_per_note, ic_notes, ic_mean = {}, {}, {}
    for phase in DECISION_KINDS:
        matrix, kept = _stack([n.contrast(phase) for n in notes])
        if len(kept) == 0:
            continue
        ic_per_note[phase], ic_notes[phase] = matrix, [notes[i].note_id for i in kept]
        ic_mean[phase] = matrix.mean(0)
        entry = {"n_notes": len(kept), "n_events": int(sum(notes[i].counts.get(phase, 0) for i in kept))}
        if len(kept) >= 2:
            disc = head_discoveries(matrix, fdr).discoveries
            entry.update(bh_positive=disc.n_positive, bh_negative=disc.n_negative)
        summary["phases"][phase] = entry

    null_matrix, null_kept = _stack([n.null for n in notes])
    if len(null_kept) >= 2:
        disc = head_discoveries(null_matrix, fdr).discoveries
        summary["null_raw_bh_positive"], summary["null_raw_bh_negative"] = disc.n_positive, disc.n_negative
        null_mean = null_matrix.mean(0)
        k = min(top_k, null_mean.size)
        summary["null_top_mean_effect"] = {"k": k, "value": float(np.sort(null_mean)[::-1][:k].mean())}
    halves, half_kept = _stack([n.null_half_difference for n in notes])
    if len(half_kept) >= 2:
        disc = head_discoveries(halves, fdr).discoveries
        summary["split_half_null_bh_positive"] = disc.n_positive
        summary["split_half_null_bh_negative"] = disc.n_negative
        summary["split_half_null_discoveries"] = disc.n_discoveries
        summary["ic_floor"] = noise_floor(halves.mean(0))

    raw_p1, raw_kept = _stack([n.raw.get("P1") for n in notes])
    if len(raw_kept):
        raw_mean = raw_p1.mean(0)
        k = min(top_k, raw_mean.size)
        summary["chapter_top_mean_effect_raw"] = {"k": k, "value": float(np.sort(raw_mean)[::-1][:k].mean())}
        if len(null_kept) >= 2:
            null_mean = null_matrix.mean(0)
            summary["raw_vs_null_ranking_spearman"] = spearman_over_heads(raw_mean, null_mean).rho
            summary["raw_vs_null_top_overlap"] = {
                str(kk): top_k_overlap(raw_mean, null_mean, kk) for kk in sorted({k, min(pool_k, raw_mean.size)})}
        if len(raw_kept) >= 2 and recurrence_top_k <= raw_mean.size:
            rec = recurrence_test(raw_p1, recurrence_top_k)
            summary["recurrence"] = {"top_k": rec.top_k, "n_recurrent": rec.n_recurrent,
                                     "expected_count": rec.expected_count, "counts": rec.counts.tolist()}
        if "P1" in ic_mean and "ic_floor" in summary:
            conc = heads_carrying_share(ic_mean["P1"], floor=summary["ic_floor"], share=0.8)
            summary["chapter_heads_above_floor"] = conc.n_above_floor
            summary["chapter_heads_carrying_80pct"] = conc.n_carrying
        per_note_carrying = []
        for n in notes:
            if n.raw.get("P1") is not None and n.null_half_difference is not None:
                floor = float(np.percentile(np.abs(n.null_half_difference), 95))
                per_note_carrying.append(heads_carrying_share(n.raw["P1"], floor=floor).n_carrying)
        if per_note_carrying:
            summary["per_note_heads_carrying_80pct_median"] = float(np.median(per_note_carrying))

    pairs = {}
    phases = list(ic_mean)
    for i, a in enumerate(phases):
        for b in phases[i + 1:]:
            k = min(pool_k, ic_mean[a].size)
            pairs[f"{a}-{b}"] = {"pearson": float(np.corrcoef(ic_mean[a], ic_mean[b])[0, 1]),
                                 "top_k": k, "top_k_shared": top_k_overlap(ic_mean[a], ic_mean[b], k)}
    summary["phase_pairs"] = pairs
    return Calibration([n.note_id for n in notes], ic_per_note, ic_notes, ic_mean, summary)


def own_rankings(calibration: Calibration) -> Mapping[str, Mapping[str, np.ndarray]]:
    """phase -> note -> that note's own I_c [L*H] (the "note's own ranking" control, App. D)."""
    return {phase: dict(zip(calibration.ic_notes[phase], calibration.ic_per_note[phase]))
            for phase in calibration.ic_per_note}
