"""App. B's prompt, frozen: header, candidate lines, note header, note, instruction.

The paper describes the prompt rather than printing it (App. B, "Prompt"): a
header naming the list as the assignable ICD-10-CM diagnosis codes, the
candidate lines (full inventory or shortlist, in the shared order), a header
introducing the discharge summary, the note, and an instruction that gives the
clinical-coder role, asks to code the summary, points back to the complete list
above, asks to narrow first to the clinically plausible region and then decide
among its specific codes, and asks for the final answer as a JSON list of code
strings.  The wording below is ours; it is frozen and identified by
`TEMPLATE_SHA256`.  The instruction control (R-C14) deletes only the
narrow-then-decide sentence.

This module returns the untemplated user text; the tokenizer's chat template
(thinking enabled) wraps it into one user turn (mistill.models).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from mistill.world.types import Note

LIST_HEADER = "The assignable ICD-10-CM diagnosis codes are listed below, one code and its description per line."
NOTE_HEADER = "Discharge summary:"
ROLE_SENTENCE = "You are an expert clinical coder."
TASK_SENTENCE = ("Code the discharge summary above with the ICD-10-CM diagnosis codes it supports, "
                 "choosing only from the complete list of assignable codes above.")
NARROW_SENTENCE = ("First narrow down to the clinically plausible region of the list, "
                   "then decide among the specific codes in it.")
ANSWER_SENTENCE = "Give your final answer as a JSON list of code strings."

TEMPLATE = "{list_header}\n\n{lines}\n\n{note_header}\n\n{note}\n\n{instruction}"


def instruction(*, narrow_instruction: bool = True) -> str:
    """The closing instruction; R-C14's control drops exactly the narrow-then-decide sentence."""
    sentences = [ROLE_SENTENCE, TASK_SENTENCE]
    if narrow_instruction:
        sentences.append(NARROW_SENTENCE)
    sentences.append(ANSWER_SENTENCE)
    return " ".join(sentences)


def build_prompt(note: Note | str, inventory_lines: Sequence[str], *, narrow_instruction: bool = True) -> str:
    """The untemplated user text for one note over the given candidate lines (kept in the order given)."""
    text = note.text if isinstance(note, Note) else note
    return TEMPLATE.format(
        list_header=LIST_HEADER,
        lines="\n".join(inventory_lines),
        note_header=NOTE_HEADER,
        note=text.strip(),
        instruction=instruction(narrow_instruction=narrow_instruction),
    )


def _template_sha256() -> str:
    frozen = {
        "template": TEMPLATE, "list_header": LIST_HEADER, "note_header": NOTE_HEADER,
        "sentences": [ROLE_SENTENCE, TASK_SENTENCE, NARROW_SENTENCE, ANSWER_SENTENCE],
    }
    return hashlib.sha256(json.dumps(frozen, sort_keys=True).encode("utf-8")).hexdigest()


# Recorded with every trace set so a changed wording is visible in provenance.
TEMPLATE_SHA256 = _template_sha256()


def template_hash() -> str:
    return TEMPLATE_SHA256
