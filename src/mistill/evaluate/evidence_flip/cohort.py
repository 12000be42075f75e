"""The evidence-flip population (App. N.1-N.2; R-D35): from drawn patients to reviewed proposals.

A case is a patient's note with an emitted gold code A, supported by evidence words in the note,
and a partner code B; the flip rewrites the evidence so that the note supports B instead.  The
population is built in locked, hash-frozen stages (`freeze`):

1. **Draw**: `n_patients` patients, seeded, disjoint from every development cohort (the retriever's
   and the teacher's training split, every corpus), one note each (the first admission), cut as a
   prompt cuts it (App. A).
2. **Retriever and shortlist**: the retriever refitted without the drawn patients (and without the
   corpora's), each drawn note shortlisted at the stored shortlists' K (RT-003).
3. **Screen**: the teacher's trace on each drawn note's shortlist prompt (evaluation decoding).
4. **Proposals**: for each drawn patient, the screen answer's gold codes are tried in answer order;
   an attempt (A, B) fails with no evidence words for A in the note, no partner for A (the pairing
   rules of params, in order: `excludes1`, ICD-10-CM's Excludes1 notes resolved in the inventory;
   `sibling`, a code of A's category), or no words for B (B has no description).  The first attempt
   that succeeds is the patient's proposal; a failed attempt does not exclude a later one.
5. **Review**: the first `review_budget` proposals in draw order are reviewed; the rest are never reached.

Authoring and approval (`authoring`) and the accounting reader follow.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import cache

from mistill.errors import UserError
from mistill.world.answers import last_json_list
from mistill.world.inventory import Inventory
from mistill.world.types import Note

NO_EVIDENCE, NO_PARTNER, NO_WORDS_FOR_B = "no_evidence_token", "no_partner", "no_words_for_b"
ATTEMPT_FAILURES = (NO_EVIDENCE, NO_PARTNER, NO_WORDS_FOR_B)
PAIRINGS = ("excludes1", "sibling")


@dataclass(frozen=True)
class CohortRules:
    """The locked rules (params `evidence_flip.rules`): what LOCK.json pins before the draw."""

    n_patients: int            # paper 300
    seed: int
    pairing: tuple[str, ...]   # partner rules, tried in order (paper: excludes1)
    review_budget: int         # proposals reviewed in draw order (paper: K = 80, amended from 60)
    samples: int               # N generations per case and condition (paper 4)
    min_effect: float          # the pre-registered delta in D (paper 0.10)

    @classmethod
    def from_params(cls, params: dict) -> CohortRules:
        section = (params.get("evidence_flip") or {}).get("rules")
        where = f"params.yaml {params.get('name', '<profile>')}.evidence_flip.rules"
        if not isinstance(section, dict):
            raise UserError(f"{where}: missing; the cohort is drawn and locked under these rules")
        missing = sorted(set(cls.__dataclass_fields__) - set(section))
        if missing:
            raise UserError(f"{where}: missing {', '.join(missing)}")
        rules = cls(int(section["n_patients"]), int(section["seed"]), tuple(section["pairing"]),
                    int(section["review_budget"]), int(section["samples"]), float(section["min_effect"]))
        unknown = [p for p in rules.pairing if p not in PAIRINGS]
        if unknown or not rules.pairing:
            raise UserError(f"{where}.pairing: rules are {', '.join(PAIRINGS)}; got {list(rules.pairing)}")
        if rules.n_patients < 1 or rules.review_budget < 0 or rules.samples < 1:
            raise UserError(f"{where}: n_patients and samples must be positive, review_budget not negative")
        return rules

    def as_dict(self) -> dict:
        return {**asdict(self), "pairing": list(self.pairing)}


# ---- 1. the draw --------------------------------------------------------------------------------------------


def draw_patients(pool: Sequence[Note], development_patients: set[str], excluded_splits: set[str], n: int,
                  seed: int) -> list[Note]:
    """`n` patients drawn (seeded) among those in no development cohort, one note each (the first
    admission), in draw order."""
    first: dict[str, Note] = {}
    for note in sorted(pool, key=lambda x: x.note_id):
        if note.patient_id in development_patients or note.split in excluded_splits:
            continue
        first.setdefault(note.patient_id, note)
    patients = sorted(first)
    drawn = random.Random(seed).sample(patients, min(n, len(patients)))
    return [first[p] for p in drawn]


# ---- 4. proposals --------------------------------------------------------------------------------------------


_CODE_REFERENCE = re.compile(r"([A-Z][0-9][0-9A-Z](?:\.[0-9A-Z]+)?)-?(?:-([A-Z][0-9][0-9A-Z](?:\.[0-9A-Z]+)?))?")


@cache
def _excludes1_notes(code: str) -> tuple[str, ...]:
    import simple_icd_10_cm as icd

    notes: list[str] = []
    for item in dict.fromkeys((code, code[:3])):    # the code's own notes and its category's
        if icd.is_valid_item(item):
            notes += icd.get_excludes1(item)
    return tuple(notes)


def excludes1_partners(code: str, inventory: Inventory) -> list[str]:
    """Inventory codes an Excludes1 note of `code` (or of its category) names: a code, a category
    (N18.-) or a range (O10-O16), each read from the notes' parentheses; in the shared order."""
    wanted: list[tuple[str, str | None]] = []
    for note in _excludes1_notes(code):
        for group in re.findall(r"\(([^()]*)\)", note):
            wanted += [(m.group(1), m.group(2)) for m in _CODE_REFERENCE.finditer(group)]
    out = []
    for candidate in inventory.codes:
        if candidate == code:
            continue
        if any((candidate[:3] >= a[:3] and candidate[:3] <= b[:3]) if b else candidate.startswith(a)
               for a, b in wanted):
            out.append(candidate)
    return out


def partner(code: str, inventory: Inventory, pairing: Sequence[str], note: Note) -> str | None:
    """B for A = `code`: the first partner the pairing rules give that is not one of the note's gold codes."""
    for rule in pairing:
        candidates = excludes1_partners(code, inventory) if rule == "excludes1" else list(inventory.siblings(code))
        candidates = [c for c in candidates if c not in note.gold_codes]
        if candidates:
            return candidates[0]
    return None


@dataclass(frozen=True)
class Attempt:
    patient_id: str
    note_id: str
    code: str
    partner: str | None
    failure: str | None        # one of ATTEMPT_FAILURES, or None for a proposal


def attempts_for(note: Note, screen_completion: str, inventory: Inventory, pairing: Sequence[str],
                 evidence_spans) -> list[Attempt]:
    """The (A, B) attempts on one drawn note, in the screen answer's order, up to the first that succeeds.

    `evidence_spans(note, code)` gives A's evidence words in the note (empty: none)."""
    out = []
    answer = [c for c in dict.fromkeys(last_json_list(screen_completion) or []) if isinstance(c, str)]
    for code in answer:
        if code not in note.gold_codes or inventory.lookup(code) is None:
            continue      # App. N.1: A is an emitted gold code
        if not evidence_spans(note, code):
            out.append(Attempt(note.patient_id, note.note_id, code, None, NO_EVIDENCE))
            continue
        b = partner(code, inventory, pairing, note)
        if b is None:
            out.append(Attempt(note.patient_id, note.note_id, code, None, NO_PARTNER))
            continue
        if not inventory[b].description.strip():
            out.append(Attempt(note.patient_id, note.note_id, code, b, NO_WORDS_FOR_B))
            continue
        out.append(Attempt(note.patient_id, note.note_id, code, b, None))
        break
    return out


def accounting(drawn: Sequence[Note], attempts: Sequence[Attempt], review_budget: int) -> dict:
    """App. N.2's counts before authoring: drawn, attempts, failures by reason, proposals, reviewed, not reached."""
    proposals = [a for a in attempts if a.failure is None]
    reviewed = min(review_budget, len(proposals))
    return {"patients_drawn": len(drawn), "candidate_attempts": len(attempts),
            "rejected_attempts": sum(a.failure is not None for a in attempts),
            "rejected_by_reason": {r: sum(a.failure == r for a in attempts) for r in ATTEMPT_FAILURES},
            "proposals": len(proposals), "patients_without_proposal": len(drawn) - len(proposals),
            "reviewed": reviewed, "not_reached": len(proposals) - reviewed}


def proposals_in_draw_order(drawn: Sequence[Note], attempts: Sequence[Attempt]) -> list[Attempt]:
    order = {n.patient_id: i for i, n in enumerate(drawn)}
    return sorted((a for a in attempts if a.failure is None), key=lambda a: order[a.patient_id])


def as_rows(attempts: Sequence[Attempt]) -> list[dict]:
    return [asdict(a) for a in attempts]


def from_rows(rows: Sequence[Mapping]) -> list[Attempt]:
    return [Attempt(**{k: r.get(k) for k in Attempt.__dataclass_fields__}) for r in rows]
