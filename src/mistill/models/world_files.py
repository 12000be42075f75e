"""The world as the models layer reads it: inventory, notes, shortlists, prompts.

One place that knows where `mistill world` wrote its files (`<artifacts>/data/`)
and how a note becomes a prompt: the full inventory, or its shortlist in the
shared order (METHOD-GUIDE §2).  Also the corpus the compact tokenizer tables
are built from, so every demo model covers every text the demo can show it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mistill.errors import UserError
from mistill.world.types import Code, Note

FULL, SHORTLIST = "full", "shortlist"


def data_dir(params: dict[str, Any]) -> Path:
    return Path(params["paths"]["artifacts"]) / "data"


@dataclass
class DemoWorld:
    inventory: Any                        # mistill.world.inventory.Inventory
    shortlists: dict[str, tuple[str, ...]]

    def candidates(self, note: Note, kind: str) -> list[Code]:
        """The candidate lines of a prompt: the full inventory, or the note's shortlist in the shared order."""
        if kind == FULL:
            return list(self.inventory)
        if note.note_id not in self.shortlists:
            raise UserError(f"note {note.note_id} has no shortlist (run `mistill world shortlists`)")
        return list(self.inventory.restrict(self.shortlists[note.note_id]))

    def prompt(self, note: Note, kind: str, *, narrow_instruction: bool = True) -> str:
        from mistill.world.inventory import format_line
        from mistill.world.prompt import build_prompt

        return build_prompt(note, [format_line(c) for c in self.candidates(note, kind)],
                            narrow_instruction=narrow_instruction)


def load_world(params: dict[str, Any], *, need_shortlists: bool = False) -> DemoWorld:
    from mistill.world.inventory import load_inventory

    root = data_dir(params)
    inventory = load_inventory(root / "inventory.jsonl")
    shortlists = load_shortlists(root / "shortlists.jsonl", required=need_shortlists)
    return DemoWorld(inventory, shortlists)


def load_shortlists(path: Path, *, required: bool) -> dict[str, tuple[str, ...]]:
    if not path.exists():
        if required:
            raise UserError(f"{path}: no shortlists (run `mistill world shortlists`)")
        return {}
    shortlists = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            shortlists[row["note_id"]] = tuple(row["codes"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"{path}:{number}: expected {{\"note_id\", \"codes\": [...]}}") from None
    return shortlists


def load_note_file(params: dict[str, Any], name: str, inventory: Any) -> list[Note]:
    from mistill.world.notes import load_notes

    path = data_dir(params) / name
    if not path.exists():
        raise UserError(f"{path}: no such notes file (run `mistill world notes` / `mistill world corpora`)")
    return load_notes(path, inventory)


def cut_for_prompt(note: Note) -> Note:
    """A pool note as it enters a prompt: App. A cuts the discharge-diagnosis section (the corpora
    files are already cut; notes.jsonl is not)."""
    try:
        from mistill.world.corpora import cut_discharge_diagnosis
    except ImportError:
        return note
    result = cut_discharge_diagnosis(note.text)
    text = result[0] if isinstance(result, tuple) else result
    return Note(note.note_id, note.patient_id, text, note.gold_codes, note.split, dict(note.meta))


def remap_corpus(world: DemoWorld, notes: list[Note]) -> list[str]:
    """Every text a demo model can be shown: inventory lines, notes, prompt frames (with and without
    the narrow-then-decide sentence), scripted traces over the full inventory and the shortlists,
    and a JSON list of every code."""
    from mistill.models.scripted_traces import script_trace

    texts = ["\n".join(c.code + " " + c.description for c in world.inventory), json.dumps(list(world.inventory.codes))]
    for note in notes:
        texts.append(note.text)
        texts.append(script_trace(note, world.candidates(note, FULL)).completion)
        if note.note_id in world.shortlists:
            texts.append(script_trace(note, world.candidates(note, SHORTLIST)).completion)
    if notes:
        texts.append(world.prompt(notes[0], FULL))
        texts.append(world.prompt(notes[0], FULL, narrow_instruction=False))
    return texts
