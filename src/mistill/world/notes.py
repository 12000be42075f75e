"""Notes on disk: `{"note_id", "patient_id", "text", "gold_codes", "split", ...}` per jsonl line.

Keys beyond the five of the contract (e.g. `source_split`, `section_cut`) are
kept in `Note.meta` and written back unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mistill.errors import UserError
from mistill.io import iter_json_lines, write_jsonl
from mistill.world.inventory import Inventory
from mistill.world.types import Note

CONTRACT_KEYS = ("note_id", "patient_id", "text", "gold_codes", "split")


def note_to_row(note: Note) -> dict[str, Any]:
    row: dict[str, Any] = {
        "note_id": note.note_id,
        "patient_id": note.patient_id,
        "text": note.text,
        "gold_codes": list(note.gold_codes),
        "split": note.split,
    }
    row.update({k: v for k, v in note.meta.items() if k not in row})
    return row


def note_from_row(row: Any, where: str) -> Note:
    """One Note from a parsed row; `where` ("file:line") names the row in errors."""
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected a JSON object")
    for key in ("note_id", "patient_id"):
        if not isinstance(row.get(key), str) or not row[key]:
            raise UserError(f"{where}: missing or empty {key!r}")
    text = row.get("text")
    if not isinstance(text, str) or not text.strip():
        raise UserError(f"{where}: note {row['note_id']} has no text")
    gold = row.get("gold_codes")
    if not isinstance(gold, list) or not all(isinstance(c, str) for c in gold):
        raise UserError(f"{where}: note {row['note_id']}: 'gold_codes' must be a list of code strings")
    split = row.get("split", "test")
    if not isinstance(split, str):
        raise UserError(f"{where}: note {row['note_id']}: 'split' must be a string")
    meta = {k: v for k, v in row.items() if k not in CONTRACT_KEYS}
    return Note(row["note_id"], row["patient_id"], text, tuple(gold), split, meta)


def validate_notes(notes: Iterable[Note], inventory: Inventory, *, source: str = "notes") -> None:
    """Every gold code must be an inventory code; note ids must be unique."""
    seen: set[str] = set()
    for note in notes:
        if note.note_id in seen:
            raise UserError(f"{source}: duplicate note_id {note.note_id}")
        seen.add(note.note_id)
        if not note.text.strip():
            raise UserError(f"{source}: note {note.note_id} has no text")
        missing = [c for c in note.gold_codes if c not in inventory]
        if missing:
            raise UserError(f"{source}: note {note.note_id}: gold code {missing[0]} is not in the inventory")


def load_notes(path: str | Path, inventory: Inventory | None = None) -> list[Note]:
    """Read a notes jsonl; with `inventory`, also check every gold code is in it.

    Raises UserError naming the file and line on a malformed line, a note
    without text, a duplicate note id, or (with `inventory`) an unknown gold code.
    """
    notes: list[Note] = []
    seen: set[str] = set()
    for where, row in iter_json_lines(path, "notes"):
        note = note_from_row(row, where)
        if note.note_id in seen:
            raise UserError(f"{where}: duplicate note_id {note.note_id}")
        seen.add(note.note_id)
        if inventory is not None:
            missing = [c for c in note.gold_codes if c not in inventory]
            if missing:
                raise UserError(f"{where}: note {note.note_id}: gold code {missing[0]} "
                                "is not in the inventory")
        notes.append(note)
    if not notes:
        raise UserError(f"{path}: no notes in the file; rebuild it "
                        "(`mistill world notes` / `mistill world corpora`)")
    return notes


def write_notes(path: str | Path, notes: Iterable[Note]) -> None:
    write_jsonl(path, [note_to_row(n) for n in notes])
