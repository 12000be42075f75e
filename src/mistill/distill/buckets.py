"""Span buckets (App. I.1, "Span buckets"): one attention axis that both tokenizers share.

Every bucket is a character range of the untemplated text U = [prompt; trace] (the trace is the
completion, starting at its reasoning block), so the teacher's and a student's pooled rows are
distributions over the same axis whatever their tokenizers.  The axis of a note is

    0                 the sink: chat-template tokens and the first position (attention sink)
    1 .. n_base       base buckets in text order: the shortlist header; one bucket per shortlist
                      line (code and description); the note in windows of 32 words (the note
                      header joins the first window); the instruction; the trace split at
                      sentence boundaries into pieces of at most 400 characters
    n_base+1 .. +5    the five carved buckets of a P2 / P2C event: the code's own line, its
                      category siblings' lines (merged: "five buckets"), S (earlier mentions of the
                      code), N (earlier mentions of the near-miss) and the code's emitted prefix

Carved slots are empty (zero mass) on rows that carve nothing (P1 events, window rows).
Base buckets tile U without gaps (each extends to the next one's start), so whitespace between
sections belongs to the bucket before it.  A token goes to the bucket holding its first non-space
character (METHOD-GUIDE §12: straddling tokens).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from mistill.errors import UserError
from mistill.world import prompt as prompt_format

NOTE_WINDOW_WORDS = 32
TRACE_PIECE_CHARS = 400
SINK = 0
CARVED_KINDS = ("own_line", "sibling_lines", "S", "N", "prefix")
# App. I.1: sentence boundaries in the trace; a dot inside a code (N18.9) is not one.
_SENTENCE_END = re.compile(r"[.?!](?=\s|$)|\n")


@dataclass(frozen=True)
class Bucket:
    kind: str          # header | line | note | instruction | trace
    start: int         # character range [start, end) in U
    end: int
    code: str | None = None  # the shortlist line's code


@dataclass
class BucketAxis:
    """The bucket axis of one note: base buckets over U plus the sink and the carved slots."""

    prompt: str
    completion: str
    base: list[Bucket]
    line_of_code: dict[str, int] = field(default_factory=dict)  # code -> axis index of its line

    @property
    def text(self) -> str:
        return self.prompt + self.completion

    @property
    def trace_start(self) -> int:
        return len(self.prompt)

    @property
    def n_buckets(self) -> int:
        return 1 + len(self.base) + len(CARVED_KINDS)

    def slot(self, kind: str) -> int:
        return 1 + len(self.base) + CARVED_KINDS.index(kind)

    def bucket_of_char(self, chars: np.ndarray) -> np.ndarray:
        """Axis index of each character position of U (-1 -> the sink)."""
        starts = [b.start for b in self.base]
        out = np.searchsorted(np.asarray(starts), chars, side="right")  # 1-based base index
        return np.where(chars < 0, SINK, out).astype(np.int64)

    def as_record(self) -> dict:
        return {"n_buckets": self.n_buckets,
                "base": [[b.kind, b.start, b.end, b.code] for b in self.base],
                "carved": list(CARVED_KINDS)}


def sentence_pieces(text: str, offset: int, cap: int = TRACE_PIECE_CHARS) -> list[tuple[int, int]]:
    """Split `text` at sentence ends, then pack whole sentences greedily into pieces <= cap
    characters; a single sentence longer than cap is cut every cap characters."""
    ends = [m.end() for m in _SENTENCE_END.finditer(text)]
    bounds = sorted({0, *ends, len(text)})
    sentences = [(a, b) for a, b in pairwise(bounds) if b > a]
    pieces: list[tuple[int, int]] = []
    cur: tuple[int, int] | None = None
    for a, b in sentences:
        if cur is not None and b - cur[0] <= cap:
            cur = (cur[0], b)
            continue
        if cur is not None:
            pieces.append(cur)
        while b - a > cap:
            pieces.append((a, a + cap))
            a += cap
        cur = (a, b)
    if cur is not None:
        pieces.append(cur)
    return [(a + offset, b + offset) for a, b in pieces]


def word_windows(text: str, offset: int, words: int = NOTE_WINDOW_WORDS) -> list[tuple[int, int]]:
    """Windows of `words` whitespace-separated words, as character ranges starting at word starts."""
    starts = [m.start() for m in re.finditer(r"\S+", text)]
    if not starts:
        return [(offset, offset + len(text))]
    window_starts = starts[::words]
    ends = window_starts[1:] + [len(text)]
    return [(a + offset, b + offset) for a, b in zip(window_starts, ends)]


def build_axis(prompt: str, completion: str) -> BucketAxis:
    """Parse App. B's prompt layout (mistill.world.prompt) into base buckets and tile the trace."""
    header_at = prompt.find(prompt_format.LIST_HEADER)
    note_header_at = prompt.find("\n\n" + prompt_format.NOTE_HEADER + "\n\n")
    instruction_at = prompt.rfind("\n\n" + prompt_format.ROLE_SENTENCE)
    if header_at != 0 or note_header_at < 0 or instruction_at < note_header_at:
        raise UserError("prompt does not follow the frozen layout of mistill.world.prompt "
                        "(list header, candidate lines, note header, note, instruction)")
    lines_start = len(prompt_format.LIST_HEADER) + 2
    base: list[Bucket] = [Bucket("header", 0, lines_start)]
    line_of_code: dict[str, int] = {}
    pos = lines_start
    for line in prompt[lines_start:note_header_at].split("\n"):
        end = pos + len(line) + 1
        code = line.split(" ", 1)[0]
        line_of_code[code] = len(base) + 1
        base.append(Bucket("line", pos, end, code))
        pos = end
    note_start = note_header_at + len(prompt_format.NOTE_HEADER) + 4
    windows = word_windows(prompt[note_start:instruction_at], note_start)
    windows[0] = (pos, windows[0][1])  # the note header joins the first window
    base.extend(Bucket("note", a, b) for a, b in windows)
    base.append(Bucket("instruction", instruction_at, len(prompt)))
    base.extend(Bucket("trace", a, b) for a, b in sentence_pieces(completion, len(prompt)))
    # tile: every bucket extends to the next one's start
    tiled = [Bucket(b.kind, b.start, nxt.start, b.code) for b, nxt in pairwise(base)] + [base[-1]]
    return BucketAxis(prompt, completion, tiled, line_of_code)


def unified_chars(offsets: list[tuple[int, int]], model_text: str, prompt_at: int, prompt_len: int,
                  completion_at: int) -> np.ndarray:
    """U-coordinate of each token's first non-space character; -1 for chat-template tokens and
    for position 0 (the sink bucket).

    model_text = chat_prompt(prompt) + completion; the prompt sits at `prompt_at` inside it, the
    completion starts at `completion_at`.
    """
    out = np.full(len(offsets), -1, dtype=np.int64)
    for i, (s, e) in enumerate(offsets):
        j = s
        while j < e and model_text[j].isspace():
            j += 1
        if j == e:
            j = s
        if prompt_at <= j < prompt_at + prompt_len:
            out[i] = j - prompt_at
        elif j >= completion_at:
            out[i] = prompt_len + (j - completion_at)
    if len(out):
        out[0] = -1
    return out


@dataclass
class TokenBuckets:
    """One model's view of a note's axis: the base bucket of every token."""

    axis: BucketAxis
    chars: np.ndarray        # U-coordinate per token (-1: sink)
    base_index: np.ndarray   # axis index per token

    def carved_index(self, ranges: list[tuple[int, int, int]]) -> np.ndarray:
        """The base index with tokens whose character falls in [start, end) moved to slot."""
        index = self.base_index.copy()
        for start, end, slot in ranges:
            index[(self.chars >= start) & (self.chars < end)] = slot
        return index


def token_buckets(axis: BucketAxis, model_text: str, offsets: list[tuple[int, int]], chat_prefix: str) -> TokenBuckets:
    prompt_at = chat_prefix.find(axis.prompt)
    if prompt_at < 0:
        raise UserError("the chat template does not contain the prompt verbatim; cannot map tokens to buckets")
    chars = unified_chars(offsets, model_text, prompt_at, len(axis.prompt), len(chat_prefix))
    return TokenBuckets(axis, chars, axis.bucket_of_char(chars))


def mentions(text: str, code: str, before: int) -> list[tuple[int, int]]:
    """Mentions of `code` in `text` ending at or before `before`, at code boundaries."""
    pattern = re.compile(r"(?<![A-Za-z0-9.])" + re.escape(code) + r"(?![0-9A-Za-z])")
    return [(m.start(), m.end()) for m in pattern.finditer(text) if m.end() <= before]


def carve_ranges(axis: BucketAxis, event: dict) -> list[tuple[int, int, int]]:
    """App. I.1: the five carved buckets of a P2 / P2C event as (start, end, slot) ranges in U.

    Own line and sibling lines (same three-character category) come from the prompt's candidate
    list (METHOD-GUIDE §5: siblings on shortlist traces are the prompt's); the prefix is the current mention's
    characters before the anchor; S and N are the earlier mentions of the code and of the
    near-miss in the trace before the current mention.  P1 rows carve nothing.
    """
    if event["kind"] not in ("P2", "P2C"):
        return []
    t0 = axis.trace_start
    anchor = event["anchor"]
    prefix = event.get("prefix") or ""
    mention_start = anchor - len(prefix)
    ranges: list[tuple[int, int, int]] = []
    code = event["code"]
    if code in axis.line_of_code:
        b = axis.base[axis.line_of_code[code] - 1]
        ranges.append((b.start, b.end, axis.slot("own_line")))
    for sib, index in axis.line_of_code.items():
        if sib != code and sib[:3] == code[:3]:
            b = axis.base[index - 1]
            ranges.append((b.start, b.end, axis.slot("sibling_lines")))
    for s, e in mentions(axis.completion, code, mention_start):
        ranges.append((t0 + s, t0 + e, axis.slot("S")))
    near = event.get("near_miss")
    if near:
        for s, e in mentions(axis.completion, near, mention_start):
            ranges.append((t0 + s, t0 + e, axis.slot("N")))
    if prefix:
        ranges.append((t0 + mention_start, t0 + anchor, axis.slot("prefix")))
    return ranges


def region_mask(axis: BucketAxis, event: dict, carved: bool) -> np.ndarray:
    """The buckets of the emitted code's chapter region (Eq. C): the shortlist lines whose code
    shares the chapter letter, plus the carved own-line and sibling slots when the row carves."""
    mask = np.zeros(axis.n_buckets, dtype=bool)
    letter = event["code"][0]
    for code, index in axis.line_of_code.items():
        if code[:1] == letter:
            mask[index] = True
    if carved:
        mask[axis.slot("own_line")] = True
        mask[axis.slot("sibling_lines")] = True
    return mask


def pool_rows_numpy(attn: np.ndarray, index: np.ndarray, n_buckets: int) -> np.ndarray:
    """Reference pooling of one row's attention over keys into buckets (used by tests and the
    teacher precompute's independent check): sum of attn[j] over keys j with index[j] == b."""
    return np.bincount(index, weights=attn, minlength=n_buckets)


def bisect_bucket(axis: BucketAxis, char: int) -> int:
    """Axis index of one U character (slow, obvious route used in tests)."""
    if char < 0:
        return SINK
    return bisect.bisect_right([b.start for b in axis.base], char)
