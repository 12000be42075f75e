"""Events across tokenizers (App. I.1, "Events across tokenizers").

Each teacher event carries an anchor: the character offset, in the completion, of the first
non-blank character its decision emits.  A model realises the event when its tokenization decides
there:

    q   = the last token that ends at or before the anchor            (the decision row)
    q+1 = the next token; kept only if it begins at the anchor, up to leading whitespace

Otherwise the event is dropped, never shifted to a neighbouring token (a merged digit run, as
SmolLM3's tokenizer writes, has no such position).  Target and competitor ids are the model's
own: the target is token q+1; each teacher competitor string c becomes the model's single token
for (leading whitespace of the target) + c + (the target token's characters after the decided
one), and is dropped when the model has no single token for it.  Window rows are paired by their
token distance before the event (exact for a student sharing the teacher's tokenizer).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import asdict, dataclass

import numpy as np

KINDS = ("P1", "P2", "P2C")


@dataclass(frozen=True)
class RealizedEvent:
    index: int             # the event's index in the teacher's events list
    kind: str
    row: int               # decision row q (logits and the supervised attention row)
    target_id: int
    competitor_ids: tuple[int, ...]

    def as_dict(self) -> dict:
        return asdict(self)


def decision_row(offsets: list[tuple[int, int]], text: str, anchor_abs: int) -> int | None:
    """q for an anchor at `anchor_abs` in the model text, or None when the model does not decide there."""
    ends = [e for _, e in offsets]
    q = bisect.bisect_right(ends, anchor_abs) - 1
    nxt = q + 1
    if q < 0 or nxt >= len(offsets):
        return None
    start, end = offsets[nxt]
    if start > anchor_abs or end <= anchor_abs or text[start:anchor_abs].strip():
        return None
    return q


class CompetitorMap:
    """The model's own single-token ids for a target's competitors, cached per string."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[str, int | None] = {}

    def single_id(self, text: str) -> int | None:
        if text not in self._cache:
            ids = self.tokenizer.encode(text).ids
            self._cache[text] = ids[0] if len(ids) == 1 else None
        return self._cache[text]

    def competitors(self, target_text: str, competitor_strings: list[str]) -> tuple[int, ...]:
        core = target_text.lstrip()
        lead, tail = target_text[: len(target_text) - len(core)], core[1:]
        out = []
        for c in competitor_strings:
            cid = self.single_id(lead + c.strip() + tail)
            if cid is not None and cid not in out:
                out.append(cid)
        return tuple(out)


def realize_events(events: list[dict], competitor_strings: list[list[str]], *, ids: list[int],
                   offsets: list[tuple[int, int]], text: str, completion_at: int,
                   competitor_map: CompetitorMap) -> list[RealizedEvent]:
    """The events (P1/P2/P2C; NULL is not supervised) this model realises, with its own ids."""
    out = []
    for i, (event, comps) in enumerate(zip(events, competitor_strings)):
        if event["kind"] not in KINDS:
            continue
        anchor_abs = completion_at + event["anchor"]
        q = decision_row(offsets, text, anchor_abs)
        if q is None:
            continue
        s, e = offsets[q + 1]
        competitors = competitor_map.competitors(text[s:e], comps)
        if not competitors or ids[q + 1] in competitors:
            continue
        out.append(RealizedEvent(i, event["kind"], q, ids[q + 1], competitors))
    return out


def realize_null_events(events: list[dict], competitor_strings: list[list[str]], target_strings: list[str], *,
                        offsets: list[tuple[int, int]], text: str, completion_at: int,
                        competitor_map: CompetitorMap) -> list[RealizedEvent]:
    """The NULL events (App. C: prose positions with a random letter as target) this model realises: the
    decision row by the anchor rule, the target and competitor letters (" A", " B", ...) as this model's
    single tokens; an event whose row or letters do not map is dropped.  `target_strings[i]` is event
    i's target letter as text (the teacher's token decoded)."""
    unk = getattr(competitor_map.tokenizer, "unk_token_id", None)

    def single(s: str) -> int | None:
        i = competitor_map.single_id(s)
        return None if i is None or i == unk else int(i)

    out = []
    for i, (event, comps, target_text) in enumerate(zip(events, competitor_strings, target_strings)):
        if event["kind"] != "NULL":
            continue
        q = decision_row(offsets, text, completion_at + int(event["anchor"]))
        target = single(target_text)
        competitors = sorted({c for c in (single(s) for s in comps) if c is not None and c != target})
        if q is None or target is None or not competitors:
            continue
        out.append(RealizedEvent(i, "NULL", q, target, tuple(competitors)))
    return out


def window_rows(event_row: int, width: int, first_row: int = 1) -> list[int]:
    """App. I.1: the W rows q-W .. q-1 before a P1 event's decision row, paired by token distance
    (returned nearest-last, distances W .. 1); rows before `first_row` are dropped."""
    return [event_row - d for d in range(width, 0, -1) if event_row - d >= first_row]


def coverage(teacher_kinds: dict[str, list[str]], realized: dict[str, list[RealizedEvent]]) -> dict:
    """Table 38: per kind, teacher events, realised events and their share; per-note median share."""
    totals = {k: [0, 0] for k in KINDS}
    per_note = []
    for note_id, kinds in teacher_kinds.items():
        got = defaultdict(int)
        for ev in realized.get(note_id, []):
            got[ev.kind] += 1
        n_teacher = sum(1 for k in kinds if k in KINDS)
        for k in KINDS:
            totals[k][0] += sum(1 for x in kinds if x == k)
            totals[k][1] += got[k]
        if n_teacher:
            per_note.append(sum(got.values()) / n_teacher)
    report = {k: {"teacher": t, "realized": r, "share": (r / t if t else float("nan"))}
              for k, (t, r) in totals.items()}
    report["per_note_median_share"] = float(np.median(per_note)) if per_note else float("nan")
    report["notes"] = len(teacher_kinds)
    return report
