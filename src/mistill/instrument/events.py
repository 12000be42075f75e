"""Decision events: P1, P2, P2C and NULL (Sec. 2.2, App. C "Event extraction").

Each coding decision is the choice of one token.  For a trace tokenised once
with offsets, events are found from the token ids, their character spans and
the inventory alone (CPU only); margins are filled afterwards by one
teacher-forced pass (`mistill.instrument.margin`).

* P1: the chapter letter at the first mention of each inventory code; the
  competitors are the other inventory letters in the same spacing variant
  (the token's text before the letter: " N", "N", "(N" ...).
* P2: each later character of a first mention, the separator "." excepted;
  the competitors are the characters that continue the prefix to another
  inventory code; a character without any is skipped.
* P2C: at a mention of a code whose sibling (same three-character category)
  was named earlier, the first character where the two differ; the single
  competitor is the sibling's character.  S = earlier mentions of the code,
  N = earlier mentions of the near-miss.  Capped at two per (code, near-miss)
  pair: the first mention and the first repeat.
* NULL: `n_null` random reasoning-prose positions at least `min_distance`
  tokens from any code token; the target is a random inventory letter (spaced
  variant) and the competitors are the other letters.

`pos` is the index of the decided token in the model input; its logits are read
at `pos - 1`.  `anchor` is the character offset, in the completion, of the first
non-blank character the decision emits, so other tokenizers can realise the
event (App. I: the event is kept only where their next token begins there).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from mistill.models.tokenizer_protocol import TextTokenizer

KINDS = ("P1", "P2", "P2C", "NULL")
DECISION_KINDS = ("P1", "P2", "P2C")

# A dotted code-shaped string (letter, digit, alnum, ".", 1-4 alnum): anything of this
# shape that is not an inventory code is an out-of-inventory mention.  Undotted
# three-character strings are not flagged ("B12" is a vitamin, not a code).
_DOTTED_CODE_SHAPE = re.compile(r"(?<![A-Za-z0-9.])[A-Z][0-9][0-9A-Z]\.[0-9A-Z]{1,4}(?![A-Za-z0-9])")


@dataclass
class Event:
    kind: str
    pos: int
    target_id: int
    competitor_ids: list[int]
    anchor: int
    code: str | None = None
    prefix: str | None = None
    near_miss: str | None = None
    s_pos: list[list[int]] | None = None  # [start, end) token spans of earlier mentions of the code
    n_pos: list[list[int]] | None = None  # ... and of the near-miss
    margin: float | None = None
    entropy: float | None = None

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None or k in ("margin", "entropy")}

    @classmethod
    def from_json(cls, row: dict) -> Event:
        return cls(**{k: row.get(k) for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Mention:
    code: str
    start: int  # character span in the model input text
    end: int


@dataclass
class ExtractionReport:
    mentions: int = 0
    unknown_mentions: list[str] = field(default_factory=list)
    unaligned_mentions: int = 0  # mentions whose letter does not end a token (not a token-level decision)
    dropped_p1_no_variant: int = 0  # P1 whose spacing variant lacks a competitor letter
    skipped_p2_no_competitor: int = 0
    p2c_uncapped: int = 0
    first_mentions: int = 0
    first_mentions_sibling_of_earlier: int = 0  # App. C: 30% of first mentions in HD-001
    null_candidates: int = 0


class LetterVariants:
    """Single-token ids of `prefix + letter`, cached per spacing variant."""

    def __init__(self, tokenizer: TextTokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[str, int | None] = {}

    def single_token_id(self, text: str) -> int | None:
        if text not in self._cache:
            enc = self.tokenizer.encode(text)
            ok = len(enc.ids) == 1 and tuple(enc.offsets[0]) == (0, len(text))
            # a compact demo vocabulary maps tokens it lacks to its unknown id: not a real token
            ok = ok and enc.ids[0] != getattr(self.tokenizer, "unk_token_id", None)
            self._cache[text] = enc.ids[0] if ok else None
        return self._cache[text]


def find_mentions(text: str, codes: Sequence[str], start: int = 0, end: int | None = None
                  ) -> tuple[list[Mention], list[str]]:
    """Inventory code strings in text[start:end], longest first, not glued to other code characters.

    Returns the mentions in text order and the out-of-inventory dotted code strings.
    """
    end = len(text) if end is None else end
    alternation = "|".join(re.escape(c) for c in sorted(set(codes), key=len, reverse=True))
    pattern = re.compile(rf"(?<![A-Za-z0-9.])(?:{alternation})(?![A-Za-z0-9])(?!\.[A-Za-z0-9])")
    mentions = [Mention(m.group(0), m.start(), m.end()) for m in pattern.finditer(text, start, end)]
    known = {(m.start, m.end) for m in mentions}
    unknown = [m.group(0) for m in _DOTTED_CODE_SHAPE.finditer(text, start, end)
               if (m.start(), m.end()) not in known]
    return mentions, unknown


def _token_index(offsets: Sequence[tuple[int, int]]) -> dict[int, int]:
    """Character -> index of the token covering it."""
    index = {}
    for i, (s, e) in enumerate(offsets):
        for c in range(s, e):
            index.setdefault(c, i)
    return index


def _first_non_blank(text: str, start: int, end: int) -> int:
    for c in range(start, end):
        if not text[c].isspace():
            return c
    return start


def note_rng(seed: int, note_id: str) -> np.random.Generator:
    """A per-note generator: the same note gets the same draw whatever the note order."""
    return np.random.default_rng([seed, zlib.crc32(note_id.encode())])


def extract_events(
    *,
    note_id: str,
    text: str,
    ids: Sequence[int],
    offsets: Sequence[tuple[int, int]],
    completion_start: int,
    codes: Sequence[str],
    tokenizer: TextTokenizer,
    n_null: int = 20,
    min_null_distance: int = 8,
    p2c_cap: int = 2,
    seed: int = 0,
    reasoning_end_marker: str = "</think>",
) -> tuple[list[Event], ExtractionReport]:
    """All events of one trace.  `text` is the model input (chat prompt + completion)."""
    report = ExtractionReport()
    variants = LetterVariants(tokenizer)
    code_set = set(codes)
    letters = sorted({c[0] for c in codes})
    tok_at = _token_index(offsets)

    mentions, unknown = find_mentions(text, codes, completion_start)
    report.mentions, report.unknown_mentions = len(mentions), unknown

    def anchor_of(tok: int) -> int:
        s, e = offsets[tok]
        return _first_non_blank(text, s, e) - completion_start

    def char_token(c: int) -> int | None:
        """The token that is exactly the one character at c, if any."""
        t = tok_at.get(c)
        return t if t is not None and tuple(offsets[t]) == (c, c + 1) else None

    # A mention is a token-level decision only if its letter ends a token.
    aligned: list[tuple[Mention, int]] = []
    for m in mentions:
        t = tok_at.get(m.start)
        if t is None or offsets[t][1] != m.start + 1:
            report.unaligned_mentions += 1
            continue
        aligned.append((m, t))

    spans = {id(m): [t, tok_at.get(m.end - 1, t) + 1] for m, t in aligned}
    events: list[Event] = []
    seen_first: set[str] = set()

    for m, letter_tok in aligned:
        if m.code in seen_first:
            continue
        seen_first.add(m.code)
        report.first_mentions += 1
        report.first_mentions_sibling_of_earlier += any(
            c != m.code and c[:3] == m.code[:3] for c in seen_first)
        # P1: the letter in its own spacing variant against every other inventory letter.
        variant = text[offsets[letter_tok][0]:m.start]
        comp = [variants.single_token_id(variant + L) for L in letters if L != m.code[0]]
        if comp and all(c is not None for c in comp):
            events.append(Event("P1", letter_tok, int(ids[letter_tok]), [int(c) for c in comp],
                                anchor_of(letter_tok), code=m.code, prefix=""))
        else:
            report.dropped_p1_no_variant += 1
        # P2: each later character; competitors continue the prefix to another code.
        for i in range(1, len(m.code)):
            ch = m.code[i]
            tok = char_token(m.start + i)
            if tok is None:
                break  # the code's characters are no longer one token each
            if ch == ".":
                continue
            prefix = m.code[:i]
            alts = sorted({c[i] for c in code_set if len(c) > i and c.startswith(prefix) and c[i] != ch})
            comp_ids = [variants.single_token_id(a) for a in alts]
            comp_ids = [int(c) for c in comp_ids if c is not None]
            if not comp_ids:
                report.skipped_p2_no_competitor += 1
                continue
            events.append(Event("P2", tok, int(ids[tok]), comp_ids, anchor_of(tok), code=m.code, prefix=prefix))

    # P2C: first differing character against a sibling named earlier; capped per (code, near-miss).
    per_pair: dict[tuple[str, str], int] = {}
    for j, (m, _) in enumerate(aligned):
        earlier = aligned[:j]
        siblings = sorted({e.code for e, _ in earlier if e.code != m.code and e.code[:3] == m.code[:3]},
                          key=lambda c: min(e.start for e, _ in earlier if e.code == c))
        for sib in siblings:
            i = next((k for k in range(3, min(len(m.code), len(sib))) if m.code[k] != sib[k]), None)
            if i is None:
                continue
            tok = char_token(m.start + i)
            comp = variants.single_token_id(sib[i])
            if tok is None or comp is None or any(m.code[k] != "." and char_token(m.start + k) is None
                                                  for k in range(1, i)):
                continue
            report.p2c_uncapped += 1
            n = per_pair.get((m.code, sib), 0)
            if n >= p2c_cap:
                continue
            per_pair[(m.code, sib)] = n + 1
            events.append(Event(
                "P2C", tok, int(ids[tok]), [int(comp)], anchor_of(tok), code=m.code, prefix=m.code[:i],
                near_miss=sib,
                s_pos=[spans[id(e)] for e, _ in earlier if e.code == m.code],
                n_pos=[spans[id(e)] for e, _ in earlier if e.code == sib]))

    events.extend(_null_events(
        note_id=note_id, text=text, ids=ids, offsets=offsets, completion_start=completion_start,
        code_spans=[(m.start, m.end) for m in mentions] + _unknown_spans(text, completion_start),
        letters=letters, variants=variants, n_null=n_null, min_distance=min_null_distance,
        seed=seed, reasoning_end_marker=reasoning_end_marker, report=report, anchor_of=anchor_of))
    events.sort(key=lambda e: (e.pos, KINDS.index(e.kind)))
    return events, report


def _unknown_spans(text: str, start: int) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in _DOTTED_CODE_SHAPE.finditer(text, start)]


def _null_events(*, note_id, text, ids, offsets, completion_start, code_spans, letters, variants, n_null,
                 min_distance, seed, reasoning_end_marker, report, anchor_of) -> list[Event]:
    """App. C: NULL positions in the reasoning prose, >= min_distance tokens from any code token."""
    think_end = text.find(reasoning_end_marker, completion_start)
    prose_end = think_end if think_end >= 0 else len(text)
    code_tokens = np.array(sorted({i for i, (s, e) in enumerate(offsets)
                                   for cs, ce in code_spans if s < ce and e > cs}), dtype=int)
    candidates = []
    for i, (s, e) in enumerate(offsets):
        if i < 1 or s < completion_start or e > prose_end:
            continue
        if code_tokens.size and np.abs(code_tokens - i).min() < min_distance:
            continue
        candidates.append(i)
    report.null_candidates = len(candidates)
    spaced = {L: variants.single_token_id(" " + L) for L in letters}
    if len(letters) < 2 or any(v is None for v in spaced.values()) or not candidates:
        return []
    rng = note_rng(seed, note_id)
    chosen = sorted(rng.choice(candidates, size=min(n_null, len(candidates)), replace=False).tolist())
    targets = rng.choice(letters, size=len(chosen))
    return [Event("NULL", int(p), int(spaced[t]), [int(spaced[L]) for L in letters if L != t], anchor_of(p),
                  code=None, prefix=None)
            for p, t in zip(chosen, targets)]
