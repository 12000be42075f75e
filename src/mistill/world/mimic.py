"""The paper profile's data: Edin et al. (2023)'s MIMIC-IV ICD-10 release.

Their public code (`prepare_data/prepare_mimiciv.py`, `generate_mimiciv_splits.py`)
writes `mimiciv_icd10.feather` (one row per admission: `subject_id`, `_id`
(the admission id), `text` lower-cased without punctuation, `icd10_diag`,
`icd10_proc`, `target`) and `mimiciv_icd10_split.feather` (`_id`, `split` in
train / val / test).  App. A: the inventory is the 5,651 ICD-10-CM diagnosis
codes of that release; procedures are never assigned.  Codes may be stored with
or without dots; they are normalised to the dotted form the teacher writes.

Feather and parquet need pyarrow; a csv export (code lists as any
space/comma/semicolon-separated text, e.g. a JSON list) is read with pandas alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from mistill.errors import UserError
from mistill.world import icd
from mistill.world.inventory import Inventory, shared_order
from mistill.world.text import clean_text
from mistill.world.types import Code, Note

ID_COLUMN = "_id"
SUBJECT_COLUMN = "subject_id"
TEXT_COLUMN = "text"
DIAGNOSIS_COLUMN = "icd10_diag"
SPLIT_COLUMN = "split"
_CODE_TOKEN = re.compile(r"[A-Za-z0-9.]+")


def read_table(path: str | Path, columns: Iterable[str]):
    """A pandas DataFrame from feather, parquet or csv, checked for the needed columns."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file")
    suffix = path.suffix.lower()
    try:
        if suffix == ".feather":
            frame = pd.read_feather(path)
        elif suffix == ".parquet":
            frame = pd.read_parquet(path)
        elif suffix == ".csv":
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        else:
            raise UserError(f"{path}: expected a .feather, .parquet or .csv table")
    except ImportError as err:
        raise UserError(f"{path}: reading {suffix} needs pyarrow ({err})") from None
    except (OSError, ValueError) as err:
        raise UserError(f"{path}: unreadable table ({err})") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(missing)}; has {', '.join(map(str, frame.columns))}")
    return frame


def _codes(cell, where: str) -> list[str]:
    """The dotted diagnosis codes of one cell (an array, a list, or text), de-duplicated in order."""
    if cell is None:
        return []
    if isinstance(cell, str):
        items = [t for t in _CODE_TOKEN.findall(cell) if t.strip(".")]
    else:
        try:
            items = list(cell)
        except TypeError:
            raise UserError(f"{where}: expected a list of codes, got {type(cell).__name__}") from None
    out: list[str] = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise UserError(f"{where}: malformed code {item!r}")
        code = icd.normalise_code(item)
        if code not in out:
            out.append(code)
    return out


def _descriptions(path: str | Path | None) -> dict[str, str]:
    if path is None:
        return {}
    frame = read_table(path, ["code", "description"])
    return {icd.normalise_code(str(c)): str(d) for c, d in zip(frame["code"], frame["description"])}


def mimiciv_inventory(table: str | Path, seed: int, *, descriptions: str | Path | None = None) -> Inventory:
    """Every diagnosis code of the release, described and in the shared fixed-seed order.

    Descriptions come from `descriptions` (a table with `code`, `description`)
    where it has the code, else from the ICD-10-CM tabular list shipped by
    simple_icd_10_cm; a code with neither is an error naming it.
    """
    frame = read_table(table, [DIAGNOSIS_COLUMN])
    supplied = _descriptions(descriptions)
    found: set[str] = set()
    for row, cell in enumerate(frame[DIAGNOSIS_COLUMN]):
        found.update(_codes(cell, f"{table}: row {row}"))
    if not found:
        raise UserError(f"{table}: no diagnosis codes in column {DIAGNOSIS_COLUMN}")
    codes, undescribed = [], []
    for code in sorted(found):
        text = supplied.get(code) or (icd.description(code) if icd.is_known(code) else None)
        if not text:
            undescribed.append(code)
            continue
        codes.append(Code(code, clean_text(text)))
    if undescribed:
        raise UserError(f"{table}: {len(undescribed)} code(s) without a description (e.g. "
                        f"{', '.join(undescribed[:5])}); supply a descriptions table")
    return Inventory(shared_order(codes, seed))


def mimiciv_notes(table: str | Path, split_table: str | Path, inventory: Inventory | None = None) -> list[Note]:
    """One Note per admission: `_id` -> note_id, `subject_id` -> patient_id, diagnoses -> gold codes.

    The split comes from the split table (admissions it lacks are an error).
    With an inventory, gold codes outside it are dropped (App. A counts "codes
    in the inventory"); the release's own inventory holds them all.
    """
    frame = read_table(table, [ID_COLUMN, SUBJECT_COLUMN, TEXT_COLUMN, DIAGNOSIS_COLUMN])
    splits = read_table(split_table, [ID_COLUMN, SPLIT_COLUMN])
    split_of = {str(i): str(s) for i, s in zip(splits[ID_COLUMN], splits[SPLIT_COLUMN])}
    notes: list[Note] = []
    for row, (note_id, patient, text, cell) in enumerate(zip(
            frame[ID_COLUMN], frame[SUBJECT_COLUMN], frame[TEXT_COLUMN], frame[DIAGNOSIS_COLUMN])):
        where = f"{table}: row {row}"
        note_id = str(note_id)
        if not isinstance(text, str) or not text.strip():
            raise UserError(f"{where}: note {note_id} has no text")
        if note_id not in split_of:
            raise UserError(f"{where}: admission {note_id} is not in {split_table}")
        gold = _codes(cell, where)
        if inventory is not None:
            gold = [c for c in gold if c in inventory]
        split = split_of[note_id]
        notes.append(Note(note_id, str(patient), text, tuple(gold), split, {"source_split": split}))
    return notes
