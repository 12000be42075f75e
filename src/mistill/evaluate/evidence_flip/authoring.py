"""Authored flips, their controls and the approval ledger (App. N.1-N.2; R-D33-R-D35).

Each reviewed proposal (A, B) becomes a case with four versions of its note:

* original   the note as the prompt shows it;
* flipped    every evidence span of A rewritten as B's words;
* irrelevant an edit of matched length (as many words as the flip rewrites) where no evidence is;
* order      the same words in another order (two evidence-free sections swapped).

A's evidence spans are the note's whole-word occurrences of A's description and of every way the
demo generator paraphrases it (`mistill.world.demo_truth.description_variants`): the words a reader
would point at for A.  Under the paper profile the flips are the author's (params
`evidence_flip.authoring` names the directory of authored case files); under the demo the note
generator authors them by the rule here, and the approval is a recorded rule (`approve`) with the
paper's reason codes:

    no_coherent_flip   B is already named in the note (ruled out), so the flipped note contradicts itself
    pair               A and B differ only in residual words (not a clinical contrast)
    evidence           A's evidence words also carry another gold code's description
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from mistill.evaluate.audit import clinically_meaningful
from mistill.world.demo_notes import EXAM_FINDINGS, RESULTS, SECTIONS
from mistill.world.demo_truth import description_variants
from mistill.world.inventory import Inventory
from mistill.world.types import Note

CONDITIONS = ("original", "flipped", "irrelevant", "order")
EXCLUSION_REASONS = ("no_coherent_flip", "pair", "evidence")
SWAPPED_SECTIONS = ("physical exam", "pertinent results")
# replacement words of the irrelevant edit: words the generator writes into evidence-free sections
_FILLER_WORDS = tuple(dict.fromkeys(w for phrase in EXAM_FINDINGS + RESULTS for w in phrase.split()))


def evidence_spans(note: Note, code: str, inventory: Inventory) -> list[tuple[int, int]]:
    """[start, end) character spans of A's evidence in the note, left to right, never overlapping."""
    spans: list[tuple[int, int]] = []
    variants = sorted(description_variants(inventory[code].description), key=len, reverse=True)
    for variant in variants:
        for m in re.finditer(rf"(?<![a-z0-9]){re.escape(variant)}(?![a-z0-9])", note.text):
            if not any(m.start() < e and s < m.end() for s, e in spans):
                spans.append((m.start(), m.end()))
    return sorted(spans)


def replace_spans(text: str, spans: Sequence[tuple[int, int]], words: str) -> tuple[str, list[tuple[int, int]]]:
    """`text` with each span replaced by `words`, and the replaced spans' positions in the new text."""
    out, new_spans, last, shift = [], [], 0, 0
    for start, end in spans:
        out += [text[last:start], words]
        new_spans.append((start + shift, start + shift + len(words)))
        shift += len(words) - (end - start)
        last = end
    out.append(text[last:])
    return "".join(out), new_spans


def section_bounds(text: str) -> dict[str, tuple[int, int]]:
    """Section name -> [start, end) of its content (after the header), for the sections the note has."""
    heads = []
    for name in SECTIONS:
        m = re.search(rf"(?<![a-z]){re.escape(name)} ", text)
        if m:
            heads.append((m.start(), m.end(), name))
    heads.sort()
    return {name: (end, (heads[i + 1][0] - 1) if i + 1 < len(heads) else len(text))
            for i, (_, end, name) in enumerate(heads)}


def _free(bounds: tuple[int, int], spans: Sequence[tuple[int, int]]) -> bool:
    return not any(s < bounds[1] and bounds[0] < e for s, e in spans)


def irrelevant_edit(text: str, spans: Sequence[tuple[int, int]], n_words: int, seed: int) -> tuple[str, int]:
    """(`text` with `n_words` words of evidence-free sections replaced by other filler words, words short)."""
    rng = random.Random(seed)
    bounds = section_bounds(text)
    edits: list[tuple[int, int, str]] = []
    left = n_words
    for name in SWAPPED_SECTIONS + ("social history", "discharge medications"):
        if left == 0 or name not in bounds or not _free(bounds[name], spans):
            continue
        start, end = bounds[name]
        for m in re.finditer(r"\S+", text[start:end]):
            if left == 0:
                break
            choices = [w for w in _FILLER_WORDS if w != m.group(0)]
            edits.append((start + m.start(), start + m.end(), rng.choice(choices)))
            left -= 1
    out, last = [], 0
    for s, e, word in sorted(edits):
        out += [text[last:s], word]
        last = e
    out.append(text[last:])
    return "".join(out), left


def order_permutation(text: str, spans: Sequence[tuple[int, int]]) -> str | None:
    """`text` with the two evidence-free sections of SWAPPED_SECTIONS swapped (headers with their words),
    or None when the note lacks either or evidence sits in one."""
    bounds = section_bounds(text)
    if not all(name in bounds for name in SWAPPED_SECTIONS):
        return None
    blocks = []
    for name in SWAPPED_SECTIONS:
        start, end = bounds[name]
        if not _free((start, end), spans):
            return None
        blocks.append((start - len(name) - 1, end))
    (a0, a1), (b0, b1) = sorted(blocks)
    return text[:a0] + text[b0:b1] + text[a1:b0] + text[a0:a1] + text[b1:]


@dataclass(frozen=True)
class Case:
    case: str
    note_id: str
    patient_id: str
    code: str                    # A
    partner: str                 # B
    texts: dict                  # condition -> note text
    evidence: dict               # "original" / "flipped" -> [start, end) spans of A's / B's words
    irrelevant_words_short: int  # the irrelevant edit's shortfall against the flip's word count

    def to_json(self) -> dict:
        return asdict(self)


def author_case(case_id: str, note: Note, code: str, partner: str, inventory: Inventory, seed: int) -> Case | None:
    """The demo's authored case: the flip and its two controls by the rules above (None: no evidence)."""
    spans = evidence_spans(note, code, inventory)
    if not spans:
        return None
    flipped, flipped_spans = replace_spans(note.text, spans, inventory[partner].description)
    n_words = sum(len(note.text[s:e].split()) for s, e in spans)
    irrelevant, short = irrelevant_edit(note.text, spans, n_words, seed)
    order = order_permutation(note.text, spans) or note.text
    return Case(case_id, note.note_id, note.patient_id, code, partner,
                {"original": note.text, "flipped": flipped, "irrelevant": irrelevant, "order": order},
                {"original": [list(s) for s in spans], "flipped": [list(s) for s in flipped_spans]}, short)


def approve(case: Case, note: Note, inventory: Inventory) -> tuple[str, str]:
    """The demo's recorded approval rule: ("accept", "") or ("exclude", reason code)."""
    b_words = inventory[case.partner].description
    if re.search(rf"(?<![a-z0-9]){re.escape(b_words)}(?![a-z0-9])", note.text):
        return "exclude", "no_coherent_flip"
    if not clinically_meaningful(inventory[case.code].description, b_words):
        return "exclude", "pair"
    others = [inventory[c].description for c in note.gold_codes if c != case.code and inventory.lookup(c)]
    evidence = [note.text[s:e] for s, e in case.evidence["original"]]
    if any(words in other or other in words for words in evidence for other in others):
        return "exclude", "evidence"
    return "accept", ""
