"""One prose-locus run as the readers see it (R-C6 on HD-001-locus, R-C7 on HD-002-locus against it).

A run is the directory `mistill locus all` wrote: per note locus.json (the walk-back of every chapter
mention), ablation.json (the ablations of its decided mentions and the read at the locus), and
head_sets_locus.json (the prose-time and suffix rankings).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.instrument.global_sets import load_head_sets, phase_scores
from mistill.io import read_json

OUTCOMES = ("window", "code", "inherited", "censored", "never")


@dataclass
class LocusRun:
    out: Path
    loci: list[Path]
    bodies: list[dict]
    ablations: list[dict]

    @classmethod
    def load(cls, out: str | Path, *, ablations: bool = True) -> LocusRun:
        """A run's walk-backs and (unless `ablations` is False: a probe-only run) its ablations."""
        out = Path(out)
        loci = sorted(out.glob("*/locus.json"))
        if not loci:
            raise UserError(f"{out}: no locus.json; run `mistill locus all` (its HD-*-locus stage) first")
        read = [read_json(p.with_name("ablation.json"), "locus ablations") for p in loci
                if ablations and p.with_name("ablation.json").exists()]
        if ablations and not read:
            raise UserError(f"{out}: no ablation.json; run `mistill locus ablate` first")
        return cls(out, loci, [read_json(p, "locus") for p in loci], read)

    @property
    def mentions(self) -> list[dict]:
        return [m for body in self.bodies for m in body["mentions"]]

    def outcome_counts(self) -> dict[str, int]:
        mentions = self.mentions
        return {o: sum(m["outcome"] == o for m in mentions) for o in OUTCOMES}

    def outcome_share(self, outcome: str) -> float:
        """Share (0-1) of the probed chapter mentions with this outcome."""
        n = len(self.mentions)
        return self.outcome_counts()[outcome] / n if n else float("nan")

    def window(self) -> list[dict]:
        window = [m for m in self.mentions if m["outcome"] == "window"]
        if not window:
            raise UserError(f"{self.out}: no chapter mention is decided in the window; no locus distance to report")
        return window

    def median_distance(self) -> float:
        return float(np.median([m["distance"] for m in self.window()]))

    def necessity(self, name: str) -> tuple[float, list[float]]:
        """Per note the mean necessity of one ablation over its decided mentions; (median over notes, per note)."""
        per_note = [float(np.mean([m["necessity"][name] for m in a["mentions"]])) for a in self.ablations if a["mentions"]]
        if not per_note:
            raise UserError(f"{self.out}: no note has a decided chapter mention with the ablation {name}")
        return float(np.median(per_note)), per_note

    @property
    def sets_path(self) -> Path:
        return self.out / "head_sets_locus.json"

    def scores(self, phase: str = "prose") -> np.ndarray:
        """I_c [L*H] of the run's prose-time ("prose") or suffix ("suffix") ranking."""
        return phase_scores(load_head_sets(self.sets_path), phase)

    def inputs(self) -> list[Path]:
        files = [*self.loci, *(p.with_name("window.npz") for p in self.loci),
                 *(p.with_name("ablation.json") for p in self.loci), self.sets_path]
        return [p for p in files if p.exists()]


@dataclass(frozen=True)
class WordingComparison:
    """One forcing wording's walk-back against the main wording's on the same mentions (App. F, Table 25)."""

    mentions: int                 # chapter mentions probed under both wordings
    category_agreement: float     # percent of them with the same outcome
    window_share: float           # percent decided in the window under this wording
    window_distances: list[int]   # its window-decided mentions' distances
    both_window: int              # mentions decided in the window under both wordings
    within_step: int              # ... whose distances differ by at most one walk-back step
    distance_differences: list[int]   # |d - d_main| of those decided in the window under both


def compare_wordings(main: Sequence[dict], other: Sequence[dict], step: int) -> WordingComparison:
    """Per mention (note, event), this wording's locus against the main wording's; `main` and `other` are the
    locus.json bodies of the two runs (the other run's notes only)."""
    by_mention = {(b["note_id"], m["event"]): m for b in main for m in b["mentions"]}
    pairs = [(by_mention[(b["note_id"], m["event"])], m) for b in other for m in b["mentions"]
             if (b["note_id"], m["event"]) in by_mention]
    if not pairs:
        raise UserError("no chapter mention was probed under both wordings")
    both = [(a, b) for a, b in pairs if a["outcome"] == b["outcome"] == "window"]
    differences = [abs(int(a["distance"]) - int(b["distance"])) for a, b in both]
    return WordingComparison(
        mentions=len(pairs), category_agreement=100.0 * sum(a["outcome"] == b["outcome"] for a, b in pairs) / len(pairs),
        window_share=100.0 * sum(b["outcome"] == "window" for _, b in pairs) / len(pairs),
        window_distances=[int(b["distance"]) for _, b in pairs if b["outcome"] == "window"],
        both_window=len(both), within_step=sum(d <= step for d in differences), distance_differences=differences)
