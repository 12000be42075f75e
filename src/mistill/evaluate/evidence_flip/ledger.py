"""The reviewed cases' files and the approval ledger, and the cohort's reconciliation (App. N.2; R-D35).

Case files are `<out_dir>/authored/<case>.json` (`authoring.Case`), one per reviewed proposal, named
EF001, EF002, ... in review order.  The ledger is a CSV `case,decision,reason` with one row per case:
decision `accept` or `exclude`, and for an exclusion one of `authoring.EXCLUSION_REASONS`.  Files the
author made (params `evidence_flip.authoring`, `.approval`) are checked against the reviewed
proposals before they are copied in; a problem stops the stage with one line naming the file.
"""

from __future__ import annotations

import csv
import io
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from mistill.errors import UserError
from mistill.evaluate.evidence_flip.authoring import CONDITIONS, EXCLUSION_REASONS, Case, author_case
from mistill.evaluate.evidence_flip.cohort import Attempt
from mistill.io import atomic_open, read_json, write_json
from mistill.world.inventory import Inventory
from mistill.world.types import Note

LEDGER_COLUMNS = ("case", "decision", "reason")


def case_ids(reviewed: Sequence[Attempt]) -> list[str]:
    return [f"EF{i:03d}" for i in range(1, len(reviewed) + 1)]


def generator_cases(reviewed: Sequence[Attempt], notes: Mapping[str, Note], inventory: Inventory, *,
                    seed: int) -> list[Case]:
    """The demo's authored cases (the generator's rule, `authoring.author_case`), in review order."""
    cases = []
    for case_id, attempt in zip(case_ids(reviewed), reviewed):
        case = author_case(case_id, notes[attempt.note_id], attempt.code, attempt.partner, inventory, seed)
        if case is None:
            raise UserError(f"{attempt.note_id}: proposal {attempt.code} -> {attempt.partner} has no evidence words; "
                            "the proposals step should have rejected it")
        cases.append(case)
    return cases


def write_cases(directory: Path, cases: Sequence[Case]) -> list[Path]:
    paths = []
    for case in cases:
        path = directory / f"{case.case}.json"
        write_json(path, case.to_json())
        paths.append(path)
    return paths


def import_cases(source: Path, directory: Path, reviewed: Sequence[Attempt]) -> list[Path]:
    """Copy the author's case files in, each checked against its reviewed proposal."""
    paths = []
    for case_id, attempt in zip(case_ids(reviewed), reviewed):
        src = source / f"{case_id}.json"
        if not src.exists():
            raise UserError(f"{src}: no authored case for reviewed proposal {case_id}")
        row = read_json(src, "authored case")
        missing = sorted(set(Case.__dataclass_fields__) - set(row))
        if missing:
            raise UserError(f"{src}: missing {', '.join(missing)}")
        if (row["note_id"], row["code"], row["partner"]) != (attempt.note_id, attempt.code, attempt.partner):
            raise UserError(f"{src}: case {case_id} is not the reviewed proposal ({attempt.code} -> {attempt.partner})")
        if sorted(row["texts"]) != sorted(CONDITIONS):
            raise UserError(f"{src}: texts must hold exactly {', '.join(CONDITIONS)}")
        dst = directory / f"{case_id}.json"
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        paths.append(dst)
    return paths


def write_ledger(path: Path, decisions: Mapping[str, tuple[str, str]]) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(LEDGER_COLUMNS)
    writer.writerows([case, decision, reason] for case, (decision, reason) in sorted(decisions.items()))
    with atomic_open(path) as f:
        f.write(buffer.getvalue())


def read_ledger(path: Path, cases: Sequence[str]) -> dict[str, tuple[str, str]]:
    """case -> (decision, reason), every reviewed case exactly once."""
    if not path.exists():
        raise UserError(f"{path}: no approval ledger")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        if list(reader.fieldnames or []) != list(LEDGER_COLUMNS):
            raise UserError(f"{path}: columns must be {','.join(LEDGER_COLUMNS)}")
        out: dict[str, tuple[str, str]] = {}
        for line, row in enumerate(reader, start=2):
            case, decision, reason = (row[c].strip() for c in LEDGER_COLUMNS)
            if case not in cases:
                raise UserError(f"{path}:{line}: case {case!r} was not reviewed")
            if case in out:
                raise UserError(f"{path}:{line}: case {case} decided twice")
            if decision not in ("accept", "exclude"):
                raise UserError(f"{path}:{line}: decision {decision!r} of {case} is not accept or exclude")
            if (decision == "exclude") != (reason in EXCLUSION_REASONS) or (decision == "accept" and reason):
                raise UserError(f"{path}:{line}: {case}: an exclusion needs one of {', '.join(EXCLUSION_REASONS)}, "
                                "an acceptance no reason")
            out[case] = (decision, reason)
    undecided = [c for c in cases if c not in out]
    if undecided:
        raise UserError(f"{path}: {len(undecided)} reviewed case(s) undecided, first {undecided[0]}")
    return out


def import_ledger(source: Path, path: Path, cases: Sequence[str]) -> None:
    read_ledger(source, cases)          # checked before it lands
    shutil.copyfile(source, path)


def reconcile(accounting: Mapping, decisions: Mapping[str, tuple[str, str]], cases: Sequence[Case]) -> dict:
    """App. N.2's accounting: the pre-authoring counts, then accepted, excluded by reason, and the cases."""
    accepted = sorted(c for c, (d, _) in decisions.items() if d == "accept")
    by_id = {c.case: c for c in cases}
    return {**accounting,
            "accepted": len(accepted), "excluded": len(decisions) - len(accepted),
            "exclusion_reasons": {r: sum(x == r for _, x in decisions.values()) for r in EXCLUSION_REASONS},
            "accepted_cases": accepted,
            "irrelevant_edit_short_cases": sum(by_id[c].irrelevant_words_short > 0 for c in accepted)}
