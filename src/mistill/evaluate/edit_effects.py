"""The trace edits read on a student's own-heads chain (App. E; readers R-D28, R-D30).

Stage (d) of `mistill.evaluate.own_heads` writes, at the student's realised contrastive events of the test
notes, teacher-forced on the teacher's traces, the margin after the most recent earlier mention of the
near-miss is replaced by filler, an unrelated code or a same-chapter code of another category
(M6-edits/<arm>-s<seed>/<note>/prefix_edit.jsonl):

    effect_v = margin(identity re-feed) - margin(variant v).

Per arm, seed and note: the mean over the note's events of the mean effect over the replacements built (a
same-shape code of the kind may not exist; the same ones in every arm), on the events every run of a
comparison carries.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.evaluate.compare import labelled_seed_dirs
from mistill.instrument.edits import PREFIX_VARIANTS
from mistill.io import read_json, read_jsonl


def arm_edit_dirs(root: Path, label: str) -> dict[int, Path]:
    """seed -> M6-edits/<label>-s<seed> holding prefix_edit.json."""
    out = labelled_seed_dirs(root / "M6-edits", label, "prefix_edit.json")
    if not out:
        raise UserError(f"{root}: no M6-edits/{label}-s<seed>/prefix_edit.json; run the own-heads chain's edits "
                        "stage")
    return out


def load_rows(edits_dir: Path) -> dict[str, list[dict]]:
    summary = read_json(edits_dir / "prefix_edit.json", "edits summary")
    return {note: read_jsonl(edits_dir / note / "prefix_edit.jsonl") for note in summary["notes"]}


def _complete(row: dict) -> bool:
    """Read with its identity re-feed and the filler (a code replacement of the same shape may not exist)."""
    return row["margin_identity"] is not None and row["margin"]["filler"] is not None


def event_effect(row: dict) -> float:
    """The mean effect over the replacements built for the event (the same ones in every arm: they are chosen
    from the text and the inventory)."""
    return float(np.mean([row["margin_identity"] - row["margin"][v] for v in PREFIX_VARIANTS
                          if row["margin"][v] is not None]))


def per_note_effect(rows_by_note: dict[str, list[dict]], shared: dict[str, set[int]]) -> dict[str, float]:
    """note -> the mean over its shared events of the mean effect over the replacements."""
    out = {}
    for note, rows in rows_by_note.items():
        effects = [event_effect(r) for r in rows if r["pos"] in shared.get(note, ()) and _complete(r)]
        if effects:
            out[note] = float(np.mean(effects))
    return out


def shared_events(runs: list[dict[str, list[dict]]]) -> dict[str, set[int]]:
    """note -> positions of the events every run carries, read (`_complete`)."""
    notes = set.intersection(*(set(r) for r in runs)) if runs else set()
    return {n: set.intersection(*({r["pos"] for r in run[n] if _complete(r)} for run in runs)) for n in notes}
