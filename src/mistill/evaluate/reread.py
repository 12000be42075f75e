"""One trained checkpoint read twice: the instrument checks of App. L.6 (R-D16).

Two checks that the own-heads readouts are properties of the checkpoint, not of how a run was
executed:

* the gate: the knock-in run again on its own, reading the head sets the chain's attribution
  stored, without the attribution pre-pass in the same process (the paper's `knockin_bins
  --no-attr`), must reproduce the chain's cell. Reported as the largest absolute difference
  between the two runs' cell values: per phase and knock-in size, the median over notes of the
  per-note mean recovery of the own top-k (App. K, M4);
* the second read: the whole chain (attribution, knock-in, read side) run again on the same
  checkpoint under other kernels (the paper: another GPU type; on a CPU: eager attention instead of
  sdpa and another thread count, which change the order of the sums). Reported per phase as the median over
  notes of the per-note recovery difference (second minus first) and its two-sided sign test, the
  difference of the two reads' P2C cell medians, the median absolute difference of the clean
  margins at the same events, and how many phases keep the identical own top-k.

The paper's text keeps the numbers, not the formulas; the reading above (reconstructed from App.
L.6 and the class-K figures of App. Q) is what `readers/r_d16.py` reports and REGISTRY.md states.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.evaluate.compare import arm_values, clustered, knockin_rows
from mistill.instrument.events import DECISION_KINDS
from mistill.stats import StatsParams


@dataclass(frozen=True)
class Read:
    """Where one read of an arm lives: `<root>/HD-S/<arm>-s<seed>` and `<root>/M6/<arm>-s<seed>`."""

    root: Path
    arm: str
    seed: int

    @property
    def m6(self) -> Path:
        return self.root / "M6" / f"{self.arm}-s{self.seed}"

    @property
    def hd(self) -> Path:
        return self.root / "HD-S" / f"{self.arm}-s{self.seed}"

    def recovery(self, phase: str, k: int, min_range: float) -> dict[str, float]:
        """note -> the note's mean gated recovery of the own top-k at `phase` (App. K, M4)."""
        values = arm_values(self.root, self.arm, "m4", phase=phase, k=k, min_range=min_range)
        if self.seed not in values:
            raise UserError(f"{self.m6}: no knock-in of seed {self.seed}")
        return values[self.seed]


def cell_medians(read: Read, bins: Sequence[int], min_range: float) -> dict[tuple[str, int], float]:
    """(phase, k) -> median over notes of the per-note mean recovery of the own top-k."""
    out = {}
    for phase in DECISION_KINDS:
        for k in bins:
            per_note = read.recovery(phase, k, min_range)
            if per_note:
                out[(phase, k)] = float(np.median(list(per_note.values())))
    return out


def largest_cell_difference(first: Read, second: Read, bins: Sequence[int], min_range: float) -> float:
    """max over phases and knock-in sizes of |cell(second) - cell(first)|; both must carry the same cells."""
    a, b = cell_medians(first, bins, min_range), cell_medians(second, bins, min_range)
    if not a or set(a) != set(b):
        raise UserError(f"{first.m6} and {second.m6}: the two runs carry different cells "
                        f"({sorted(a)} against {sorted(b)})")
    return max(abs(b[c] - a[c]) for c in a)


def clean_margins(m6_dir: Path) -> dict[tuple[str, str, int], float]:
    """(note, phase, position) -> the clean margin the knock-in rows recorded."""
    return {(note, r["kind"], int(r["pos"])): float(r["margin_clean"])
            for note, rows in knockin_rows(m6_dir).items() for r in rows if r.get("margin_clean") is not None}


def clean_margin_difference(first: Read, second: Read) -> tuple[float, int]:
    """(median over shared events of |clean margin(second) - clean margin(first)|, number of events)."""
    a, b = clean_margins(first.m6), clean_margins(second.m6)
    shared = sorted(set(a) & set(b))
    if not shared:
        raise UserError(f"{first.m6} and {second.m6}: no knock-in event in common")
    return float(np.median([abs(b[e] - a[e]) for e in shared])), len(shared)


def top_k_sets(hd_dir: Path, k: int) -> dict[str, frozenset[int]]:
    """phase -> the own top-k heads by I_c of a read's attribution."""
    from mistill.evaluate.own_heads import own_scores
    from mistill.instrument.global_sets import load_head_sets

    scores = own_scores(load_head_sets(hd_dir / "head_sets_contrast.json"))
    return {p: frozenset(int(h) for h in np.argsort(-s, kind="stable")[:k]) for p, s in scores.items()}


def same_top_k_phases(first: Read, second: Read, k: int) -> tuple[int, int]:
    """(phases whose own top-k is the same set in both reads, phases ranked in both)."""
    a, b = top_k_sets(first.hd, k), top_k_sets(second.hd, k)
    shared = sorted(set(a) & set(b))
    return sum(a[p] == b[p] for p in shared), len(shared)


def per_note_differences(first: Read, second: Read, *, k: int, stats: StatsParams, min_range: float,
                         phases: Sequence[str] = ("P2C", "P2", "P1")) -> dict[str, dict]:
    """phase -> the note-clustered comparison of the second read against the first (own top-k recovery):
    `median_difference` (median over notes of the per-note difference), `sign_p`, counts higher/lower."""
    out = {}
    for phase in phases:
        a, b = first.recovery(phase, k, min_range), second.recovery(phase, k, min_range)
        result = clustered({second.seed: b}, {first.seed: a}, stats)
        if result is None:
            raise UserError(f"{first.m6} and {second.m6}: no note carries {phase} knock-in at k={k} in both reads")
        out[phase] = result
    return out


def cell_median_difference(first: Read, second: Read, *, phase: str, k: int, min_range: float) -> float:
    """median over notes of the second read minus that of the first (one cell)."""
    a, b = first.recovery(phase, k, min_range), second.recovery(phase, k, min_range)
    if not a or not b:
        raise UserError(f"{first.m6} and {second.m6}: no {phase} knock-in at k={k} in both reads")
    return float(np.median(list(b.values())) - np.median(list(a.values())))


def reread_summary(first: Read, gate: Read, second: Read, *, bins: Sequence[int], stats: StatsParams,
                   min_range: float) -> Mapping[str, object]:
    """Every number R-D16 reports, from the chain's read, the gate's and the second read."""
    k = max(bins)
    margin, n_events = clean_margin_difference(first, second)
    same, ranked = same_top_k_phases(first, second, k)
    return {"k": k, "gate_largest_difference": largest_cell_difference(first, gate, bins, min_range),
            "per_note": per_note_differences(first, second, k=k, stats=stats, min_range=min_range),
            "p2c_cell_difference": cell_median_difference(first, second, phase="P2C", k=k, min_range=min_range),
            "clean_margin_difference": margin, "clean_margin_events": n_events,
            "same_top_k_phases": same, "ranked_phases": ranked}
