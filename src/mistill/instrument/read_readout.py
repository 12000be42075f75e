"""Per-head read-side values from HD-001-read's rows (App. E "Definitions"; Tables 16-19).

A row of `read.jsonl` is one decision event: the panel heads' shares over the 15 key categories, their
region lift and n_eff, and each head's importance at that event.  The paper's values are

* a head's share on a set of categories, its lift, n_eff: per note the mean over the note's events of
  the phase, then the median over notes ("medians over notes of per-note means");
* a group's (random panel, top-k, bottom-k) share: per note the mean over its heads of their per-note
  means, then the median over notes;
* r: the Pearson correlation, across a head's events of the phase (every note), between its share on
  the categories (the region at P1, N at P2C) and its importance at that event.

The region is the emitted chapter's inventory lines (readside.REGION_CATEGORIES); the prose is
`trace_prose`; N and S are the earlier mentions of the near-miss and of the code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from scipy.stats import pearsonr

from mistill.instrument.readside import CAT, REGION_CATEGORIES

REGION = REGION_CATEGORIES
PROSE = ("trace_prose",)
NEAR_MISS = ("trace_N",)
OWN_CODE = ("trace_S",)
PREFIX = ("trace_prefix",)
SIBLINGS = ("category_lines",)
SINK = ("sink",)
NOTE = ("note",)
CODE_LINES = ("own_line", "category_lines", "chapter_lines", "other_chapter_lines", "near_miss_line")

Rows = Mapping[str, Sequence[dict]]   # note -> its read.jsonl rows


def load_reads(read_dir: Path) -> tuple[dict, dict[str, list[dict]]]:
    """(read_panel.json, note -> read.jsonl rows) of one read-side pass's directory."""
    from mistill.errors import UserError
    from mistill.io import read_json, read_jsonl

    panel_path = Path(read_dir) / "read_panel.json"
    if not panel_path.exists():
        raise UserError(f"{panel_path}: missing; run `mistill instrument readside` (stages HD-001-read, HD-002-read)")
    summary = read_json(panel_path, "read-side panel")
    rows = {}
    for note in summary["notes"]:
        path = Path(read_dir) / note / "read.jsonl"
        if not path.exists():
            raise UserError(f"{path}: missing; run `mistill instrument readside` (stages HD-001-read, HD-002-read)")
        rows[note] = read_jsonl(path)
    return summary, rows


def _head_events(rows: Sequence[dict], phase: str, head: int):
    for row in rows:
        if row["kind"] == phase and head in row["heads"]:
            yield row, row["heads"].index(head)


def share_per_note(rows_by_note: Rows, phase: str, head: int, categories: Sequence[str]) -> dict[str, float]:
    """note -> the mean over the note's `phase` events of the head's attention on `categories`."""
    cats = [CAT[c] for c in categories]
    out = {}
    for note, rows in rows_by_note.items():
        values = [sum(row["shares"][i][c] for c in cats) for row, i in _head_events(rows, phase, head)]
        if values:
            out[note] = float(np.mean(values))
    return out


def lift_per_note(rows_by_note: Rows, phase: str, head: int) -> dict[str, float]:
    """note -> the mean over the note's events of the head's region lift (events without line attention left out)."""
    out = {}
    for note, rows in rows_by_note.items():
        values = [row["lift"][i] for row, i in _head_events(rows, phase, head) if row["lift"][i] is not None]
        if values:
            out[note] = float(np.mean(values))
    return out


def group_per_note(rows_by_note: Rows, phase: str, heads: Sequence[int], categories: Sequence[str]
                   ) -> dict[str, float]:
    """note -> the mean over `heads` of their per-note shares (a group's share on one note)."""
    per_head = [share_per_note(rows_by_note, phase, h, categories) for h in heads]
    notes = sorted(set().union(*per_head)) if per_head else []
    return {n: float(np.mean([p[n] for p in per_head if n in p])) for n in notes}


def group_lift_per_note(rows_by_note: Rows, phase: str, heads: Sequence[int]) -> dict[str, float]:
    per_head = [lift_per_note(rows_by_note, phase, h) for h in heads]
    notes = sorted(set().union(*per_head)) if per_head else []
    return {n: float(np.mean([p[n] for p in per_head if n in p])) for n in notes}


def median(per_note: Mapping[str, float]) -> float | None:
    return float(np.median(list(per_note.values()))) if per_note else None


def percentiles(per_note: Mapping[str, float], q: Sequence[float]) -> list[float] | None:
    return [float(x) for x in np.percentile(list(per_note.values()), q)] if per_note else None


def share_importance_r(rows_by_note: Rows, phase: str, head: int, categories: Sequence[str]) -> float | None:
    """Pearson r across the head's events between its share on `categories` and its importance there."""
    cats = [CAT[c] for c in categories]
    share, importance = [], []
    for rows in rows_by_note.values():
        for row, i in _head_events(rows, phase, head):
            share.append(sum(row["shares"][i][c] for c in cats))
            importance.append(row["importance"][i])
    if len(share) < 3 or np.ptp(share) == 0 or np.ptp(importance) == 0:
        return None   # r is undefined for a constant column
    return float(pearsonr(share, importance).statistic)


def notes_above(a: Mapping[str, float], b: Mapping[str, float]) -> tuple[int, int]:
    """(notes where a > b, notes with both)."""
    shared = sorted(set(a) & set(b))
    return sum(a[n] > b[n] for n in shared), len(shared)


def mean_query_key_score(rows_by_note: Rows, phase: str, head: int) -> float | None:
    """The head's mean App. E query-key score (cos with the mean S key minus cos with the mean N key) over
    its events that have both S and N; None when it has none."""
    values = [row["qk_s_minus_n"][i] for rows in rows_by_note.values() for row, i in _head_events(rows, phase, head)
              if row.get("qk_s_minus_n") and row["qk_s_minus_n"][i] is not None]
    return float(np.mean(values)) if values else None


def by_unit(per_note: Mapping[str, float], units: Mapping[str, str]) -> dict[str, float]:
    """unit -> the mean of its notes' values (App. C "Patients": a patient's prompt variants averaged first)."""
    grouped: dict[str, list[float]] = {}
    for note, x in per_note.items():
        grouped.setdefault(units[note], []).append(x)
    return {unit: float(np.mean(xs)) for unit, xs in grouped.items()}
