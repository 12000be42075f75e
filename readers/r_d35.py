"""R-D35 (App. N.2): the evidence-flip population, from drawn patients to approved cases.

From EF-authored's cohort_row.json (`mistill evaluate ef-cohort`, `ef-authored`;
`mistill.evaluate.evidence_flip`), read only after it and the review selection it reconciles are
verified against their frozen hashes: patients drawn, (A, B) attempts and their failures by reason,
proposals (one per patient), patients without one, proposals reviewed in draw order, accepted and
excluded (by reason code), and proposals never reached.  Counts are exact given the frozen stages.
"""

from __future__ import annotations

from pathlib import Path

from mistill.evaluate.evidence_flip.authoring import EXCLUSION_REASONS
from mistill.evaluate.evidence_flip.cohort import ATTEMPT_FAILURES
from mistill.evaluate.evidence_flip.commands import FlipSettings
from mistill.evaluate.evidence_flip.freeze import verify
from mistill.instrument.readout import run_reader, value
from mistill.io import read_json

READER = "readers/r_d35.py"

COUNTS = {"patients_drawn": "count of patients drawn (one note each)",
          "proposals": "count of proposals (one per patient)",
          "reviewed": "count of proposals reviewed in draw order",
          "accepted": "count of cases accepted",
          "excluded": "count of reviewed proposals excluded",
          "not_reached": "count of proposals never reviewed",
          "candidate_attempts": "count of candidate (A, B) attempts",
          "rejected_attempts": "count of failed attempts",
          "patients_without_proposal": "count of drawn patients without a proposal"}


def keys(params: dict) -> list[str]:
    return [*COUNTS, "exclusion_reasons", "rejected_attempts_by_reason", "irrelevant_edit_short_cases"]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    settings = FlipSettings.from_params(params)
    row_path = settings.cases_dir / "cohort_row.json"
    selection = settings.cohort_dir / "selection.json"
    verify(settings.cases_dir, [row_path, settings.cases_dir / "approval_ledger.csv"])
    verify(settings.cohort_dir, [selection])
    row = read_json(row_path, "cohort reconciliation")
    art = str(row_path)
    v = {key: value(int(row[key]), statistic, art) for key, statistic in COUNTS.items()}
    v["exclusion_reasons"] = value([int(row["exclusion_reasons"][r]) for r in EXCLUSION_REASONS],
                                   "counts of exclusions: [" + ", ".join(r.replace("_", " ") for r in EXCLUSION_REASONS)
                                   + "]", art)
    v["rejected_attempts_by_reason"] = value([int(row["rejected_by_reason"][r]) for r in ATTEMPT_FAILURES],
                                             "counts of failed attempts: [" + ", ".join(
                                                 r.replace("_", " ") for r in ATTEMPT_FAILURES) + "]", art)
    v["irrelevant_edit_short_cases"] = value(int(row["irrelevant_edit_short_cases"]),
                                             "count of accepted cases whose irrelevant edit fell short", art)
    return v, [row_path, selection]


def main() -> int:
    return run_reader("R-D35", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
