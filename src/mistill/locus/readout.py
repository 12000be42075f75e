"""One prose-locus run as the readers see it (R-C6 on HD-001-locus, R-C7 on HD-002-locus against it).

A run is the directory `mistill locus all` wrote: per note locus.json (the walk-back of every chapter
mention), ablation.json (the ablations of its decided mentions and the read at the locus), and
head_sets_locus.json (the prose-time and suffix rankings).
"""

from __future__ import annotations

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
    def load(cls, out: str | Path) -> LocusRun:
        out = Path(out)
        loci = sorted(out.glob("*/locus.json"))
        if not loci:
            raise UserError(f"{out}: no locus.json; run `mistill locus all` (its HD-*-locus stage) first")
        ablations = [read_json(p.with_name("ablation.json"), "locus ablations") for p in loci
                     if p.with_name("ablation.json").exists()]
        if not ablations:
            raise UserError(f"{out}: no ablation.json; run `mistill locus ablate` first")
        return cls(out, loci, [read_json(p, "locus") for p in loci], ablations)

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
