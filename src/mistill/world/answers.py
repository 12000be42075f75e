"""App. K answer parsing and validity.

* A generation is valid iff it closes its reasoning block (`</think>`) before
  the token cap.  An invalid generation scores as an empty answer; codes are
  never scraped from unfinished reasoning.
* The answer is the LAST JSON list after the closing `</think>`, restricted to
  inventory codes (case and dots normalised: "n189" -> "N18.9") and
  de-duplicated in emission order.  No JSON repair is attempted.
* The degenerate-output guard flags a generation with at least 10 codes of
  which more than 90% of consecutive pairs are in ascending code order
  (METHOD-GUIDE §4, recommended reading of "ascending"), more than 50 codes, or
  one that reached the cap.  Degenerate answers are flagged, not emptied; the
  distillation excludes them from every arm (App. J).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from itertools import pairwise

from mistill.world.inventory import Inventory

THINK_CLOSE = "</think>"
SORTED_GUARD_MIN_CODES = 10
SORTED_GUARD_SHARE = 0.9
MAX_CODES = 50


@dataclass(frozen=True)
class ParsedAnswer:
    valid: bool
    hit_cap: bool
    degenerate: bool
    answer: tuple[str, ...]       # scored codes: empty when invalid
    emitted: tuple[str, ...]      # the final list's strings as written (before restriction)

    def to_row(self) -> dict:
        row = asdict(self)
        row["answer"], row["emitted"] = list(self.answer), list(self.emitted)
        return row


def last_json_list(text: str) -> list | None:
    """The last top-level JSON list in `text` (scanning left to right, skipping nested lists)."""
    decoder = json.JSONDecoder()
    found, pos = None, text.find("[")
    while pos != -1:
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            pos = text.find("[", pos + 1)
            continue
        if isinstance(value, list):
            found = value
            pos = text.find("[", end)
        else:
            pos = text.find("[", pos + 1)
    return found


def ascending_share(codes: list[str] | tuple[str, ...]) -> float:
    """Share of consecutive pairs (a, b) with a < b; 0 for fewer than two codes."""
    pairs = list(pairwise(codes))
    return sum(a < b for a, b in pairs) / len(pairs) if pairs else 0.0


def is_degenerate(codes: list[str] | tuple[str, ...], hit_cap: bool) -> bool:
    return (hit_cap or len(codes) > MAX_CODES
            or (len(codes) >= SORTED_GUARD_MIN_CODES and ascending_share(codes) > SORTED_GUARD_SHARE))


def parse_answer(completion: str, inventory: Inventory, *, hit_cap: bool) -> ParsedAnswer:
    """Validity, answer and degenerate flag of one generation (the text after the assistant header).

    `hit_cap` says the generation stopped at the new-token cap (the caller
    knows; the text alone does not).
    """
    close = completion.find(THINK_CLOSE)
    if hit_cap or close == -1:
        return ParsedAnswer(valid=False, hit_cap=hit_cap, degenerate=hit_cap, answer=(), emitted=())
    final = last_json_list(completion[close + len(THINK_CLOSE):]) or []
    emitted = tuple(item for item in final if isinstance(item, str))
    answer: list[str] = []
    for item in emitted:
        entry = inventory.lookup(item) if item.strip() else None
        if entry is not None and entry.code not in answer:
            answer.append(entry.code)
    return ParsedAnswer(valid=True, hit_cap=False, degenerate=is_degenerate(answer, False),
                        answer=tuple(answer), emitted=emitted)
