"""Table 49's cells: one arm's own-trace knock-in beside its teacher-forced cell on the same notes (App. L.4).

Per arm and seed, from the own-trace chain (`mistill.evaluate.own_traces`, `<own root>/M6/<arm>-s<seed>/`) and the
teacher-forced chain (`<artifacts>/M6/<arm>-s<seed>/`), both read by `mistill.evaluate.compare.arm_values`:

* own(n): note n's mean gated recovery of the arm's own top-k at P2C on its own completed trace;
* forced(n): the same on the teacher's trace of note n;
* the cell: the mean of own over the notes with a measurable own-trace recovery (the coverage), the mean of
  forced on those of them that also carry a teacher-forced value, and their paired change, the mean over those
  notes of own(n) - forced(n) (with how many are higher).

Means over notes, as the paper's Table 49 (the teacher-forced Table 45 reports medians).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.evaluate.compare import arm_values, seed_dirs
from mistill.evaluate.own_traces import OwnTraceRun, load_coverage


@dataclass(frozen=True)
class Change:
    """own minus forced on the notes carrying both."""

    own: float
    forced: float
    mean: float
    n: int
    higher: int


@dataclass
class OwnTraceArm:
    """One arm label's own-trace readout at every seed its own-trace chain ran, beside its teacher-forced cells."""

    label: str
    artifacts: Path          # holds M6/ (teacher-forced)
    own_root: Path           # holds runs/ and M6/ (own traces)
    min_range: float = 1.0
    _memo: dict = field(default_factory=dict, repr=False)

    @property
    def seeds(self) -> list[int]:
        return list(seed_dirs(self.own_root, self.label))

    def values(self, k: int, *, forced: bool = False, set_kind: str = "top", phase: str = "P2C"
               ) -> dict[int, dict[str, float]]:
        """seed -> {note: recovery} on the own traces (or, `forced`, on the teacher's)."""
        memo = (k, forced, set_kind, phase)
        if memo in self._memo:
            return self._memo[memo]
        root = self.artifacts if forced else self.own_root
        out = arm_values(root, self.label, "m4", phase=phase, k=k, set_kind=set_kind, min_range=self.min_range)
        missing = [s for s in self.seeds if s not in out]
        if missing:
            raise UserError(f"{root}/M6/{self.label}-s{missing[0]}: no knock-in summary")
        self._memo[memo] = {s: out[s] for s in self.seeds}
        return self._memo[memo]

    def change(self, seed: int, k: int, set_kind: str = "top") -> Change | None:
        own = self.values(k, set_kind=set_kind)[seed]
        forced = self.values(k, forced=True, set_kind=set_kind)[seed]
        notes = sorted(set(own) & set(forced))
        if not notes:
            return None
        d = np.array([own[n] - forced[n] for n in notes])
        return Change(float(np.mean([own[n] for n in notes])), float(np.mean([forced[n] for n in notes])),
                      float(d.mean()), len(notes), int((d > 0).sum()))

    def mean(self, seed: int, k: int, set_kind: str = "top") -> float | None:
        own = self.values(k, set_kind=set_kind)[seed]
        return float(np.mean(list(own.values()))) if own else None

    def measurable(self, seed: int, k: int) -> int:
        return len(self.values(k)[seed])

    def completed(self, seed: int) -> int:
        return int(load_coverage(self.own_root, self.label, seed)["completed"])

    def generated(self, seed: int) -> int:
        return int(load_coverage(self.own_root, self.label, seed)["generated"])

    def where(self, forced: bool = False) -> str:
        return f"{self.artifacts if forced else self.own_root}/M6/{self.label}-s*"

    def inputs(self) -> list[Path]:
        return [p for s in self.seeds for p in (OwnTraceRun(self.own_root, self.label, s).m6_dir,
                                                OwnTraceRun(self.own_root, self.label, s).coverage,
                                                self.artifacts / "M6" / f"{self.label}-s{s}")]
