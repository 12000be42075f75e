"""Scripted coding traces: the completions the demo teacher is trained to write.

A trace imitates the coarse-to-fine procedure the paper characterizes (Sec. 2.2,
App. B): inside the reasoning block, for each finding it quotes the finding,
narrows to a chapter ("the findings point to chapter N ..."), then writes
candidate codes character by character as the tokenizer writes them, each
followed by its description; for a gold code
with a category sibling among the candidate lines it first names that sibling
and rejects it, so the chosen code is written AFTER its near-miss was named.
That ordering is what creates P2C decisions (App. C: the first character where
a code differs from a sibling the trace named earlier).  The block closes with
`</think>` and the final answer is a JSON list (App. K).

    <think>
    the summary documents chronic kidney disease stage 3 moderate; the findings point to chapter N.
    N18.4 chronic kidney disease stage 4 severe is ruled out in the summary, rejected.
    N18.3 chronic kidney disease stage 3 moderate is documented, accepted.
    ...
    </think>

    ["N18.3", "E11.9"]

Findings follow the order in which their descriptions first appear in the
note, so the trace reads the note top to bottom; quoting the finding first
makes the chapter and code a function of the words just written (the tiny
teacher has to learn the coding from a few hundred notes).  The rejected sibling is the one the note rules out when there is
one (its description is in the text), otherwise a seeded draw among the
candidate siblings.  Only candidate lines are ever named: a gold code missing
from a shortlist is skipped, as a model restricted to the list would.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass

from mistill.world.types import Code, Note

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class TraceDecision:
    """One accepted code and the sibling named (and rejected) before it, if any."""

    code: str
    near_miss: str | None


@dataclass(frozen=True)
class ScriptedTrace:
    completion: str               # "<think>\n...</think>\n\n[...]", as the model writes it
    answer: tuple[str, ...]       # the final JSON list
    decisions: tuple[TraceDecision, ...]


def _first_position(text: str, description: str) -> int:
    position = text.find(description)
    return position if position >= 0 else len(text)


def _seed(note_id: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{note_id}".encode()).digest()[:8], "big")


def script_trace(note: Note, candidates: Sequence[Code], *, seed: int = 0, near_misses: bool = True) -> ScriptedTrace:
    """The scripted completion of `note` over the candidate lines (full inventory or shortlist).

    With `near_misses=False` no sibling is named or rejected: each finding's line is followed by
    its accepted code alone, so the trace holds no contrastive (P2C) decision. The same draws are
    made, so the accepted codes and their order do not change."""
    rng = random.Random(_seed(note.note_id, seed))
    by_code = {c.code: c for c in candidates}
    gold = [c for c in dict.fromkeys(note.gold_codes) if c in by_code]
    text = note.text
    gold.sort(key=lambda c: _first_position(text, by_code[c].description))

    lines, decisions = [THINK_OPEN], []
    for code in gold:
        lines.append(f"the summary documents {by_code[code].description}; "
                     f"the findings point to chapter {code[0]}.")
        siblings = [c for c in by_code if c != code and c[:3] == code[:3] and c not in gold]
        ruled_out = [c for c in siblings if by_code[c].description in text]
        near_miss = None
        if ruled_out:
            near_miss = min(ruled_out, key=lambda c: _first_position(text, by_code[c].description))
            rejection = f"{near_miss} {by_code[near_miss].description} is ruled out in the summary, rejected."
        elif siblings:
            near_miss = rng.choice(sorted(siblings))
            rejection = f"{near_miss} {by_code[near_miss].description} is not documented, rejected."
        if near_miss is not None and near_misses:
            lines.append(rejection)
        lines.append(f"{code} {by_code[code].description} is documented, accepted.")
        decisions.append(TraceDecision(code, near_miss if near_misses else None))
    if not gold:
        lines.append("no listed code is supported by the summary.")
    completion = "\n".join(lines) + f"\n{THINK_CLOSE}\n\n" + json.dumps(gold)
    return ScriptedTrace(completion, tuple(gold), tuple(decisions))
