"""App. A's corpus rules, general over any note pool (MIMIC-IV or the demo's).

Characterization corpus (TR-006; also the distillation validation set):
  notes of one source split (the test split) are eligible with
  `min_words`..`max_words` words and `min_codes`..`max_codes` gold codes in the
  inventory; selection is stratified over the four quartiles of that code
  count and, within a stratum, greedy on ICD-10 blocks not yet covered, with at
  most one note per patient.  A note enters the prompt without its
  discharge-diagnosis section; `kept_section_variants` extra traces of the first
  selected notes keep it (the paper's six pilot variants: 100 traces, 94 notes).

Distillation corpus (TR-008): train and test notes drawn from another source
split, one note per patient, disjoint from each other and from the
characterization patients.

Readings where App. A is silent (METHOD-GUIDE §1, recommended):
  * words are whitespace tokens of the preprocessed text;
  * quartile strata use the cut points q1, q2, q3 of the eligible notes' code
    counts: stratum 0 holds counts <= q1, 1 holds (q1, q2], 2 holds (q2, q3],
    3 holds > q3;
  * strata are visited round-robin (so they contribute equally while they
    last); within a stratum the note with the most uncovered blocks wins, ties
    broken by a seeded random key;
  * the discharge-diagnosis section runs from a "discharge diagnos..." header
    to the next known section header (or the end); every cut is logged.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from statistics import median

import numpy as np

from mistill.errors import UserError
from mistill.world import icd
from mistill.world.inventory import Inventory
from mistill.world.text import word_count
from mistill.world.types import Note

# Section headers of MIMIC-IV discharge summaries (lower-cased, unpunctuated).
KNOWN_SECTION_HEADERS = (
    "chief complaint", "major surgical or invasive procedure", "history of present illness",
    "past medical history", "social history", "family history", "physical exam", "pertinent results",
    "brief hospital course", "medications on admission", "discharge medications",
    "discharge disposition", "facility", "discharge condition", "discharge instructions",
    "followup instructions",
)
_DIAGNOSIS_HEADER = re.compile(r"\bdischarge diagnos[a-z]*\b")
_NEXT_HEADER = re.compile(r"\b(" + "|".join(KNOWN_SECTION_HEADERS) + r")\b")


# -- the discharge-diagnosis section
@dataclass(frozen=True)
class SectionCut:
    start: int           # character span removed from the original text
    end: int
    words_removed: int
    next_header: str | None


def cut_discharge_diagnosis(text: str) -> tuple[str, list[SectionCut]]:
    """Remove every discharge-diagnosis section; return the text and the cuts (empty if none found)."""
    cuts: list[SectionCut] = []
    pos = 0
    while match := _DIAGNOSIS_HEADER.search(text, pos):
        following = _NEXT_HEADER.search(text, match.end())
        end = following.start() if following else len(text)
        cuts.append(SectionCut(match.start(), end, word_count(text[match.start():end]),
                               following.group(1) if following else None))
        pos = end
    if not cuts:
        return text, []
    kept, last = [], 0
    for cut in cuts:
        kept.append(text[last:cut.start])
        last = cut.end
    kept.append(text[last:])
    return " ".join(" ".join(kept).split()), cuts


# -- eligibility
@dataclass(frozen=True)
class Eligibility:
    min_words: int
    max_words: int
    min_codes: int
    max_codes: int

    @classmethod
    def from_params(cls, params: dict) -> Eligibility:
        return cls(int(params["min_words"]), int(params["max_words"]),
                   int(params["min_codes"]), int(params["max_codes"]))

    def accepts(self, note: Note, inventory: Inventory) -> bool:
        return (self.min_words <= word_count(note.text) <= self.max_words
                and self.min_codes <= n_inventory_codes(note, inventory) <= self.max_codes)


def n_inventory_codes(note: Note, inventory: Inventory) -> int:
    return len({c for c in note.gold_codes if c in inventory})


def note_blocks(note: Note, inventory: Inventory) -> set[str]:
    return {icd.block(c) for c in note.gold_codes if c in inventory}


def quartile_strata(counts: Sequence[int]) -> list[int]:
    """Stratum 0..3 of each count by the quartile cut points (q1, q2, q3) of `counts`."""
    if not counts:
        return []
    cut_points = np.quantile(np.asarray(counts, dtype=float), [0.25, 0.5, 0.75])
    return [int(np.searchsorted(cut_points, c, side="left")) for c in counts]


def _tiebreak(notes: Iterable[Note], seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    return {note_id: rng.random() for note_id in sorted(n.note_id for n in notes)}


# -- characterization corpus
@dataclass
class CharacterizationSelection:
    notes: list[Note]                    # in selection order
    strata: dict[str, int]               # note_id -> stratum
    n_eligible: int
    cut_points: list[float]
    covered_blocks: set[str] = field(default_factory=set)


def select_characterization(notes: Sequence[Note], inventory: Inventory, *, eligibility: Eligibility,
                            size: int, source_split: str, seed: int) -> CharacterizationSelection:
    """App. A: stratified over code-count quartiles, greedy on uncovered blocks, one note per patient."""
    pool = [n for n in notes if n.split == source_split and eligibility.accepts(n, inventory)]
    counts = [n_inventory_codes(n, inventory) for n in pool]
    strata = quartile_strata(counts)
    by_stratum: dict[int, list[Note]] = {s: [] for s in range(4)}
    for note, stratum in zip(pool, strata):
        by_stratum[stratum].append(note)
    tiebreak = _tiebreak(pool, seed)
    blocks = {n.note_id: note_blocks(n, inventory) for n in pool}
    chosen: list[Note] = []
    covered: set[str] = set()
    patients: set[str] = set()
    while len(chosen) < size:
        progressed = False
        for stratum in range(4):
            if len(chosen) >= size:
                break
            candidates = [n for n in by_stratum[stratum] if n.patient_id not in patients]
            if not candidates:
                continue
            best = max(candidates, key=lambda n: (len(blocks[n.note_id] - covered), tiebreak[n.note_id]))
            chosen.append(best)
            covered |= blocks[best.note_id]
            patients.add(best.patient_id)
            by_stratum[stratum].remove(best)
            progressed = True
        if not progressed:
            break
    if len(chosen) < size:
        raise UserError(f"characterization corpus: only {len(chosen)} eligible notes of distinct patients "
                        f"in split {source_split!r} ({len(pool)} eligible), need {size}")
    cut_points = np.quantile(counts, [0.25, 0.5, 0.75]).tolist() if counts else []
    stratum_of = {n.note_id: s for n, s in zip(pool, strata)}
    return CharacterizationSelection(chosen, {n.note_id: stratum_of[n.note_id] for n in chosen},
                                     len(pool), cut_points, covered)


# -- distillation corpus
def select_distillation(notes: Sequence[Note], inventory: Inventory, *, eligibility: Eligibility | None,
                        n_train: int, n_test: int, source_split: str, exclude_patients: Iterable[str],
                        seed: int) -> tuple[list[Note], list[Note]]:
    """App. A: new train and test notes, one per patient, none of an excluded (characterization) patient."""
    excluded = set(exclude_patients)
    by_patient: dict[str, list[Note]] = {}
    for note in notes:
        if note.split != source_split or note.patient_id in excluded:
            continue
        if eligibility is not None and not eligibility.accepts(note, inventory):
            continue
        by_patient.setdefault(note.patient_id, []).append(note)
    rng = random.Random(seed)
    patients = sorted(by_patient)
    rng.shuffle(patients)
    if len(patients) < n_train + n_test:
        raise UserError(f"distillation corpus: {len(patients)} eligible patients in split {source_split!r}, "
                        f"need {n_train + n_test}")
    picked = [rng.choice(sorted(by_patient[p], key=lambda n: n.note_id)) for p in patients[:n_train + n_test]]
    return picked[:n_train], picked[n_train:]


# -- what enters the prompt
def prompt_note(note: Note, split: str, *, cut: bool) -> tuple[Note, list[SectionCut]]:
    """The note as it enters the prompt: the diagnosis section cut (logged in meta), `split` set to its role."""
    meta = dict(note.meta)
    meta.setdefault("source_split", note.split)
    meta["words_original"] = word_count(note.text)
    text, cuts = (cut_discharge_diagnosis(note.text) if cut else (note.text, []))
    meta["section_cut"] = [c.__dict__ for c in cuts] if cut else None
    return replace(note, text=text, split=split, meta=meta), cuts


def characterization_traces(selection: CharacterizationSelection, *, cut: bool,
                            kept_section_variants: int) -> list[Note]:
    """The characterization notes as prompts, plus variants of the first notes with the section kept."""
    traces = []
    for note in selection.notes:
        traced, _ = prompt_note(note, "char", cut=cut)
        traced.meta["stratum"] = selection.strata[note.note_id]
        traces.append(traced)
    for note in selection.notes[:kept_section_variants]:
        variant, _ = prompt_note(note, "char", cut=False)
        variant.meta.update(stratum=selection.strata[note.note_id], variant_of=note.note_id)
        traces.append(replace(variant, note_id=f"{note.note_id}-kept"))
    return traces


def corpus_summary(notes: Sequence[Note], inventory: Inventory) -> dict:
    """Counts the report states for a corpus (App. A: notes, patients, blocks, chapters, codes per note)."""
    codes = [n_inventory_codes(n, inventory) for n in notes]
    blocks = set().union(*(note_blocks(n, inventory) for n in notes)) if notes else set()
    chapters = {icd.chapter(c) for n in notes for c in n.gold_codes if c in inventory}
    return {
        "n_notes": len(notes),
        "n_patients": len({n.patient_id for n in notes}),
        "n_blocks": len(blocks),
        "n_icd_chapters": len(chapters),
        "icd_chapters": sorted(chapters, key=lambda c: (len(c), c)),
        "n_chapter_letters": len({c[0] for n in notes for c in n.gold_codes if c in inventory}),
        "gold_codes": {"min": min(codes, default=0), "median": median(codes) if codes else 0,
                       "max": max(codes, default=0)},
        "words": {"median": median([word_count(n.text) for n in notes]) if notes else 0},
    }
