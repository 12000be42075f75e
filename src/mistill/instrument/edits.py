"""Editing the input at contrastive events: the earlier mention and the note's words (App. E).

Both edits change some tokens of the model input and keep every position: each
edited token is replaced by exactly one token, so the decision of a P2C event e
(code c, near-miss sibling n) still sits at pos(e), read at the row q = pos(e) - 1,
and its margin is read as usual,

    m_v(e)   = logit_v(target) - logsumexp(logits_v of the competitors)   at row q,
    effect_v = m_identity(e) - m_v(e)            (positive: the edit lowered the margin).

The reference is the identity edit: the same tokens through exactly the same
re-feed path as every variant.

Re-feed.  The clean prefill's cache holds keys for every position.  A variant
that first differs at token s is run by feeding the variant's tokens s .. q against
the prefill's keys below s, so the logits at q see the edit through every later
position.  The prefix edits pack many variants into one forward (`refeed_packed`):
their tokens are appended after the prefill's n keys, each with its own positions,
under a mask by which a variant's tokens see the keys [0, s) of the prefill and the
variant's own earlier tokens only; the prefill's keys are left untouched.  A variant
too long for the cache's free slots, and every note edit, is run by cropping the
cache to s and feeding its tokens in place: it overwrites the cache from s on, so
these re-feeds are visited in decreasing s (the cache is only ever cropped) and,
once done, the cache holds the prefill's keys below the smallest such edit start
only.

Prefix (trace) edits.  At a P2C event, the most recent earlier mention of the
near-miss, token span [s, t) (the last of the event's N spans), becomes

  * identity:        the same tokens;
  * filler:          t - s copies of one non-code filler token;
  * unrelated:       an inventory code of the same shape (letters, digits and dots
                     in the same places) from another chapter (another first letter);
  * other_category:  an inventory code of the same chapter and another
                     three-character category.

A code replacement is written into the text and the text re-encoded; it is
accepted only if the encoding is ids[:s] + span' + ids[t:] with |span'| = t - s
(nothing outside the span moves).  Candidates are tried in a seeded order, stable
per (seed, note, event, variant); if none fits the variant is missing for the
event.  Each variant is read twice at q: plain, and with the mediation heads
mean-ablated at q (their mean mu over the clean prefill, App. C), so

    mediated share = 1 - (m_identity^abl - m_v^abl) / (m_identity - m_v).

At most `max_events` events per note (the paper: 20), a seeded subset.

Note (evidence) edits.  The unit is the word (the notes are lower-cased running
text).  Content words of a description: its alphabetic words of at least four
letters minus a short list of structural words (`STRUCTURAL_WORDS`).  For the
pair (c, n), the code's distinguishing words are the content words of c's
description that n's description lacks and that occur as whole words in the
note section of the prompt; an event without any is not edited.  Variants, each
replacing EVERY occurrence of its words in the note (and only there) by filler,
token for token (a token belongs to an occurrence [a, b) if its characters
overlap it and lie within [a - 1, b), so a leading space goes with the word):

  * identity:       nothing replaced (the reference);
  * evidence:       the code's distinguishing words;
  * sibling:        the near-miss's distinguishing words (n against c), if any;
  * other_chapter:  as many note words as the evidence set, drawn (seeded) from
                    content-word-shaped note words found only in descriptions of
                    other chapters' codes;
  * no_description: as many, drawn from content-word-shaped note words found in
                    no description.

One re-feed per variant and (c, n) pair, from its earliest edited token through
the largest decision row of the pair's events, gives the margin at every event
row of the pair; the identity is re-fed from the earliest edit of the pair.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mistill.instrument.events import Event
from mistill.instrument.hook import HeadHook, Replacement
from mistill.instrument.margin import margin
from mistill.instrument.patching import Prefill, additive_mask, crop_to, forward_at
from mistill.models.tokenizer_protocol import TextTokenizer

PREFIX_VARIANTS = ("filler", "unrelated", "other_category")
NOTE_VARIANTS = ("evidence", "sibling", "other_chapter", "no_description")
FILLER = " ."  # one token in Qwen3's and SmolLM3's vocabularies, and in every compact demo table

# Words that build ICD-10-CM descriptions rather than name a finding: qualifiers
# ("other", "unspecified", "with", "without"), encounter suffixes of injury codes
# ("initial encounter", "sequela") and the generic heads and joints of many
# descriptions ("disorder", "site", "classified elsewhere").  A sibling differing
# from the code only in these ("other" against "unspecified", "with" against
# "without") has no evidence words of its own in the note.  Words under four
# letters are excluded by length anyway; the short ones are listed for clarity.
STRUCTURAL_WORDS = frozenset({
    "with", "without", "other", "unspecified", "specified", "initial", "encounter", "subsequent",
    "sequela", "due", "from", "and", "the", "of", "in", "to", "for", "by", "or", "not", "than", "more",
    "disorder", "disorders", "condition", "conditions", "type", "site", "sites", "part", "parts",
    "classified", "elsewhere", "involving", "associated", "mentioned", "routine", "delayed",
    "healing", "nonunion", "malunion",
})
_WORD = re.compile(r"[A-Za-z0-9]+")


@dataclass
class NoteInput:
    """One note's model input: chat_prompt(prompt) + completion, tokenised once (`passes.model_input`)."""

    note_id: str
    text: str
    ids: list[int]
    offsets: list[tuple[int, int]]
    completion_start: int
    prompt: str | None = None  # the untemplated user text (App. B), needed by the note edits

    @classmethod
    def from_trace(cls, tokenizer: TextTokenizer, trace) -> NoteInput:
        from mistill.instrument.passes import model_input

        text, ids, offsets, start = model_input(tokenizer, trace)
        return cls(trace.note_id, text, ids, offsets, start, trace.prompt)


@dataclass(frozen=True)
class EditSettings:
    filler_id: int
    mediation_heads: tuple[tuple[int, int], ...] = ()  # (layer, head), mean-ablated at q in a second read
    seed: int = 0
    max_events: int = 20
    max_candidates: int = 64  # replacement codes tried per variant before it is given up


def filler_token_id(tokenizer: TextTokenizer, filler: str = FILLER) -> int:
    """The id of `filler`, which must be exactly one known token."""
    enc = tokenizer.encode(filler)
    ok = len(enc.ids) == 1 and tuple(enc.offsets[0]) == (0, len(filler))
    ok = ok and enc.ids[0] != getattr(tokenizer, "unk_token_id", None)
    if not ok:
        raise ValueError(f"edit filler {filler!r} is not exactly one known token of {tokenizer.name} "
                         f"(it encodes as {enc.ids})")
    return int(enc.ids[0])


def _rng(*parts) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(":".join(str(p) for p in parts).encode()))


def select_events(events: Sequence[Event], *, seed: int, note_id: str, max_events: int = 20) -> list[Event]:
    """The note's P2C events with an earlier mention of the near-miss: a seeded subset of at most
    `max_events`, in position order (the same subset for both edits)."""
    eligible = [e for e in events if e.kind == "P2C" and e.near_miss and e.n_pos]
    if len(eligible) > max_events:
        keep = _rng(seed, note_id, "edit-events").choice(len(eligible), size=max_events, replace=False)
        eligible = [eligible[i] for i in sorted(keep.tolist())]
    return sorted(eligible, key=lambda e: e.pos)


# ---- prefix (trace) edits ------------------------------------------------------------------------


def near_miss_spans(note: NoteInput, event: Event) -> list[list[int]]:
    """Token spans [s, t) of the near-miss's earlier whole-code mentions in the completion, found from the
    text: the N of an event realised in another tokenizer than the one that extracted it (App. E's
    edits on the students).  Tokens that overlap a mention belong to its span."""
    if not event.near_miss:
        return []
    completion = note.text[note.completion_start:]
    mention_start = int(event.anchor) - len(event.prefix or "")
    ends = [e for _, e in note.offsets]
    spans = []
    for m in re.finditer(rf"(?<![A-Za-z0-9.]){re.escape(event.near_miss)}(?![A-Za-z0-9])(?!\.[A-Za-z0-9])",
                         completion[:max(mention_start, 0)]):
        start, end = note.completion_start + m.start(), note.completion_start + m.end()
        s = bisect.bisect_right(ends, start)                       # first token ending after the mention starts
        t = s
        while t < len(note.offsets) and note.offsets[t][0] < end:
            t += 1
        if s < t:
            spans.append([s, t])
    return spans


def with_near_miss_spans(note: NoteInput, events: Sequence[Event]) -> list[Event]:
    """`events` with each P2C event's `n_pos` found from the text (`near_miss_spans`)."""
    return [dataclasses.replace(e, n_pos=near_miss_spans(note, e)) if e.kind == "P2C" else e for e in events]


def code_shape(code: str) -> str:
    """Letters -> "A", digits -> "9", anything else kept: "N18.4" -> "A99.9"."""
    return "".join("A" if ch.isalpha() else "9" if ch.isdigit() else ch for ch in code)


@dataclass(frozen=True)
class PrefixVariant:
    span_ids: list[int]  # the new tokens of [s, t)
    replacement: str     # the code written there, "filler", or the near-miss itself (identity)


def replacement_candidates(near_miss: str, codes: Sequence[str], kind: str) -> list[str]:
    """Same-shape inventory codes: of another chapter ('unrelated') or of the same chapter and another
    category ('other_category'), sorted."""
    shape = code_shape(near_miss)
    same = [c for c in set(codes) if c != near_miss and code_shape(c) == shape]
    if kind == "unrelated":
        return sorted(c for c in same if c[0] != near_miss[0])
    if kind == "other_category":
        return sorted(c for c in same if c[0] == near_miss[0] and c[:3] != near_miss[:3])
    raise ValueError(f"unknown code replacement {kind!r}")


def prefix_variants(note: NoteInput, event: Event, *, codes: Sequence[str], tokenizer: TextTokenizer,
                    filler_id: int, seed: int, max_candidates: int = 64) -> dict[str, PrefixVariant | None]:
    """identity, filler, unrelated, other_category of the last earlier mention of the near-miss."""
    s, t = (int(x) for x in event.n_pos[-1])
    ids, text = note.ids, note.text
    chars_from, chars_to = note.offsets[s][0], note.offsets[t - 1][1]
    at = text.find(event.near_miss, chars_from, chars_to)
    if at < 0:
        raise ValueError(f"note {note.note_id}: tokens [{s}, {t}) do not hold {event.near_miss}")
    out: dict[str, PrefixVariant | None] = {
        "identity": PrefixVariant(list(ids[s:t]), event.near_miss),
        "filler": PrefixVariant([int(filler_id)] * (t - s), "filler"),
    }
    unk = getattr(tokenizer, "unk_token_id", None)
    for kind in ("unrelated", "other_category"):
        out[kind] = None
        candidates = replacement_candidates(event.near_miss, codes, kind)
        order = _rng(seed, note.note_id, event.pos, kind).permutation(len(candidates))
        for k in order[:max_candidates]:
            code = candidates[int(k)]
            enc = tokenizer.encode(text[:at] + code + text[at + len(code):])
            new = list(enc.ids)
            if len(new) == len(ids) and new[:s] == list(ids[:s]) and new[t:] == list(ids[t:]) \
                    and unk not in new[s:t]:
                out[kind] = PrefixVariant(new[s:t], code)
                break
    return out


# ---- re-feeding against the prefill's cache ------------------------------------------------------


PACK_TOKENS = 512  # tokens of one packed re-feed forward (params read_side.edits.pack_tokens)


@dataclass(frozen=True)
class Refeed:
    """One variant's re-feed: `tokens` at positions start, start + 1, ..., then the token at `read_at`
    read there (plain, and with the mediation heads mean-ablated)."""

    start: int
    tokens: list[int]
    read_at: int
    read_token: int

    def width(self, n_reads: int) -> int:
        """Tokens it takes in a packed forward."""
        return len(self.tokens) + n_reads


def free_slots(cache) -> int:
    """Slots a forward can append to the cache without overwriting it (a growing cache: no limit)."""
    layers = getattr(cache, "layers", None) or []
    capacity = getattr(layers[0], "capacity", None) if layers else None
    return (capacity - cache.get_seq_length()) if capacity is not None else 1 << 62


def packs(widths: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive groups of the items, each of total width at most `budget` (every width fits alone)."""
    groups: list[list[int]] = []
    used = budget
    for i, width in enumerate(widths):
        if used + width > budget:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += width
    return groups


def packed_mask(refeeds: Sequence[Refeed], n_reads: int, n_cached: int, dtype: torch.dtype, device
                ) -> torch.Tensor:
    """[1, 1, T, n_cached + T] additive mask of a packed re-feed: a variant's tokens see the cache [0, start)
    and the variant's earlier tokens, causally; its reads see the cache [0, start), the variant's tokens
    before `read_at`, and themselves."""
    T = sum(r.width(n_reads) for r in refeeds)
    visible = torch.zeros(T, n_cached + T, dtype=torch.bool)
    at = 0
    for r in refeeds:
        L = len(r.tokens)
        seen = min(L, r.read_at - r.start)  # the variant's tokens the reads see: positions below read_at
        block = slice(at, at + L + n_reads)
        visible[block, :r.start] = True
        visible[at:at + L, n_cached + at:n_cached + at + L] = torch.ones(L, L, dtype=torch.bool).tril()
        visible[at + L:at + L + n_reads, n_cached + at:n_cached + at + seen] = True
        reads = torch.arange(at + L, at + L + n_reads)
        visible[reads, n_cached + reads] = True
        at += L + n_reads
    return additive_mask(visible.to(device), dtype)


@torch.no_grad()
def refeed_packed(model, hook: HeadHook, pre: Prefill, refeeds: Sequence[Refeed], n_reads: int,
                  mediation_heads: Sequence[tuple[int, int]]) -> list[torch.Tensor]:
    """Logits [n_reads, V] of each re-feed, all from one forward appended after the prefill's keys.

    Read 0 is plain; read 1 (when `mediation_heads` are given) has those heads mean-ablated at the
    read (their mean mu over the clean prefill).  The cache is cropped back afterwards: the prefill's
    keys are untouched, so re-feeds are free to come in any order.
    """
    cache = pre.cache
    n_cached = cache.get_seq_length()
    device = _device(model)
    ids, positions, reads = [], [], []
    for r in refeeds:
        ids += [*r.tokens, *[r.read_token] * n_reads]
        positions += [*range(r.start, r.start + len(r.tokens)), *[r.read_at] * n_reads]
        reads += range(len(ids) - n_reads, len(ids))
    replacement = None
    if mediation_heads:
        mask = torch.zeros(hook.n_layers, len(ids), hook.n_heads, dtype=torch.bool)
        for layer, head in mediation_heads:
            mask[layer, reads[1::n_reads], head] = True
        replacement = Replacement(mask, pre.mu)
    try:
        with hook.replacing(replacement):
            out = model(input_ids=torch.as_tensor(ids, device=device)[None],
                        position_ids=torch.as_tensor(positions, device=device)[None],
                        attention_mask=packed_mask(refeeds, n_reads, n_cached, model.dtype, device),
                        past_key_values=cache, use_cache=True,
                        logits_to_keep=torch.as_tensor(reads, device=device))
    finally:
        crop_to(cache, n_cached)
    logits = out.logits[0]
    logits = logits if logits.dtype == torch.float64 else logits.float()
    return list(logits.reshape(len(refeeds), n_reads, -1))


@contextlib.contextmanager
def _variant_writes(cache, start: int) -> Iterator[None]:
    """Crop to `start`, then let a variant write its own keys from `start` on and read them back.

    A sealed PatchCache refuses positions above the first slot a variant wrote (`PatchCache.crop_to`);
    here the variant rebuilds every slot it reads, so the guard is lifted while it runs and
    restored after, lowered to `start`: below it the prefill's keys are still intact.
    """
    crop_to(cache, start)
    layers = [layer for layer in getattr(cache, "layers", []) if hasattr(layer, "intact")]
    saved = [layer.intact for layer in layers]
    for layer in layers:
        layer.intact = None
    try:
        yield
    finally:
        for layer, intact in zip(layers, saved):
            layer.intact = None if intact is None else min(intact, start)


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _append(model, hook: HeadHook, cache, tokens: Sequence[int], start: int, rows: Sequence[int] | None
            ) -> torch.Tensor | None:
    """One forward of `tokens` at positions start.. appending to the cache; logits [R, V] at `rows`."""
    device = _device(model)
    ids = torch.as_tensor([int(x) for x in tokens], device=device)[None]
    positions = torch.arange(start, start + ids.shape[1], device=device)[None]
    keep = torch.as_tensor([r - start for r in rows], device=device) if rows else 1
    with hook.replacing(None):
        out = model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True,
                    logits_to_keep=keep)
    if not rows:
        return None
    logits = out.logits[0]
    return logits if logits.dtype == torch.float64 else logits.float()


def refeed_in_place(model, hook: HeadHook, pre: Prefill, refeed: Refeed, n_reads: int,
                    replacement: Replacement | None) -> torch.Tensor:
    """Logits [n_reads, V] of one re-feed written into the cache from its start on (crop, feed, read):
    the prefill's keys from there on are gone, so such re-feeds come in decreasing start."""
    with _variant_writes(pre.cache, refeed.start):
        _append(model, hook, pre.cache, refeed.tokens, refeed.start, None)
        return forward_at(model, hook, pre.cache, [refeed.read_at] * n_reads, [refeed.read_token] * n_reads,
                          replacement)


def mediation_replacement(hook: HeadHook, pre: Prefill, heads: Sequence[tuple[int, int]]) -> Replacement:
    """Two variants at q: [:, 0] plain, [:, 1] with `heads` mean-ablated."""
    mask = torch.zeros(hook.n_layers, 2, hook.n_heads, dtype=torch.bool)
    for layer, head in heads:
        mask[layer, 1, head] = True
    return Replacement(mask, pre.mu)


@torch.no_grad()
def prefix_edit_note(model, hook: HeadHook, pre: Prefill, note: NoteInput, events: Sequence[Event], *,
                     codes: Sequence[str], tokenizer: TextTokenizer, settings: EditSettings,
                     pack_tokens: int = PACK_TOKENS) -> list[dict]:
    """The prefix edits of one note's selected P2C events; one row per event (in position order).

    `pre` is the clean prefill of note.ids (its cache and mu).  The variants are re-fed in packs of at
    most `pack_tokens` tokens (and the cache's free slots: `prefill(..., reserve=pack_tokens)`), which
    leave the cache as it was; a variant longer than that is re-fed in place and overwrites the cache
    from its edit start on.
    """
    heads = list(settings.mediation_heads)
    replacement = mediation_replacement(hook, pre, heads) if heads else None
    n_reads = 2 if heads else 1
    rows, jobs = [], []
    for e in select_events(events, seed=settings.seed, note_id=note.note_id, max_events=settings.max_events):
        s, t = (int(x) for x in e.n_pos[-1])
        variants = prefix_variants(note, e, codes=codes, tokenizer=tokenizer, filler_id=settings.filler_id,
                                   seed=settings.seed, max_candidates=settings.max_candidates)
        row = {"pos": e.pos, "code": e.code, "near_miss": e.near_miss, "edit_start": s, "edit_end": t,
               "margin_identity": None, "margin": {v: None for v in PREFIX_VARIANTS},
               "margin_identity_ablated": None, "margin_ablated": {v: None for v in PREFIX_VARIANTS},
               "replacement": {v: (variants[v].replacement if variants[v] else None) for v in PREFIX_VARIANTS}}
        rows.append(row)
        jobs += [(s, t, e, name, v, row) for name, v in variants.items() if v is not None]
    refeeds = [Refeed(s, [*variant.span_ids, *note.ids[t:e.pos - 1]], e.pos - 1, note.ids[e.pos - 1])
               for s, t, e, name, variant, row in jobs]
    free = min(pack_tokens, free_slots(pre.cache))
    packed = [i for i, r in enumerate(refeeds) if r.width(n_reads) <= free]
    logits: dict[int, torch.Tensor] = {}
    for pack in packs([refeeds[i].width(n_reads) for i in packed], free):
        chunk = [packed[i] for i in pack]
        logits.update(zip(chunk, refeed_packed(model, hook, pre, [refeeds[i] for i in chunk], n_reads, heads)))
    # what does not fit beside the prefill is re-fed in place, in decreasing s: stable, ties keep their order
    for i in sorted(set(range(len(jobs))) - set(logits), key=lambda i: -jobs[i][0]):
        logits[i] = refeed_in_place(model, hook, pre, refeeds[i], n_reads, replacement)
    for i, (s, t, e, name, variant, row) in enumerate(jobs):
        m = [float(margin(logits[i][b], e.target_id, e.competitor_ids)) for b in range(n_reads)]
        if name == "identity":
            row["margin_identity"] = m[0]
            row["margin_identity_ablated"] = m[1] if heads else None
        else:
            row["margin"][name] = m[0]
            row["margin_ablated"][name] = m[1] if heads else None
    return rows


# ---- note (evidence) edits -----------------------------------------------------------------------


def words(text: str) -> list[str]:
    """The lower-cased alphabetic words of a text (runs of letters and digits that hold no digit)."""
    return [w.lower() for w in _WORD.findall(text) if w.isalpha()]


def is_content_word(word: str) -> bool:
    return len(word) >= 4 and word.isalpha() and word.lower() not in STRUCTURAL_WORDS


def content_words(description: str) -> set[str]:
    """Alphabetic words of at least four letters, structural words removed."""
    return {w for w in words(description) if is_content_word(w)}


def distinguishing_words(description: str, other: str, note_words: set[str] | None = None) -> list[str]:
    """Content words of `description` that `other` lacks (and, if given, that occur in the note), sorted."""
    out = content_words(description) - set(words(other))
    return sorted(out if note_words is None else out & note_words)


def note_char_span(note: NoteInput) -> tuple[int, int]:
    """The note's own text (after its header, before the instruction) as a span of the model input."""
    from mistill.instrument.readside import parse_prompt
    from mistill.world.prompt import NOTE_HEADER

    if note.prompt is None:
        raise ValueError(f"note {note.note_id}: the note edits need the untemplated prompt")
    at = note.text.rfind(note.prompt, 0, note.completion_start)
    if at < 0:
        raise ValueError(f"note {note.note_id}: the prompt is not inside the model input")
    _, _, note_start, instruction_start = parse_prompt(note.prompt)
    return at + note_start + len(NOTE_HEADER), at + instruction_start - 2


def note_word_occurrences(note: NoteInput) -> dict[str, list[tuple[int, int]]]:
    """Content-word-shaped words of the note -> the character spans of their whole-word occurrences."""
    start, end = note_char_span(note)
    out: dict[str, list[tuple[int, int]]] = {}
    for m in _WORD.finditer(note.text, start, end):
        if is_content_word(m.group(0)):
            out.setdefault(m.group(0).lower(), []).append((m.start(), m.end()))
    return out


def word_tokens(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[int]:
    """Tokens of the word occurrences: overlapping [a, b) and lying within [a - 1, b)."""
    starts = [int(s) for s, _ in offsets]
    out = set()
    for a, b in spans:
        j = bisect.bisect_left(starts, b) - 1  # the last token starting before b
        while j >= 0 and offsets[j][1] > a:
            s, e = offsets[j]
            if s >= a - 1 and e <= b:
                out.add(j)
            j -= 1
    return sorted(out)


def control_pools(note_words: set[str], inventory: Mapping[str, str], chapter: str
                  ) -> tuple[list[str], list[str]]:
    """(note words found only in descriptions of other chapters than `chapter`, note words found in no
    description), each sorted."""
    own, others = set(), set()
    for code, description in inventory.items():
        (own if code[0] == chapter else others).update(words(description))
    other_chapter = sorted(w for w in note_words if w in others and w not in own)
    no_description = sorted(w for w in note_words if w not in others and w not in own)
    return other_chapter, no_description


def evidence_word_sets(code: str, near_miss: str, inventory: Mapping[str, str], note_words: set[str], *,
                       seed: int, note_id: str) -> dict[str, list[str] | None]:
    """The words of each note-edit variant for the pair (code, near-miss); None where a set is missing."""
    evidence = distinguishing_words(inventory[code], inventory[near_miss], note_words)
    sibling = distinguishing_words(inventory[near_miss], inventory[code], note_words)
    out: dict[str, list[str] | None] = {"evidence": evidence or None, "sibling": sibling or None}
    other_chapter, no_description = control_pools(note_words, inventory, code[0])
    for kind, pool in (("other_chapter", other_chapter), ("no_description", no_description)):
        if not evidence or len(pool) < len(evidence):
            out[kind] = None
            continue
        pick = _rng(seed, note_id, code, near_miss, kind).choice(len(pool), size=len(evidence), replace=False)
        out[kind] = sorted(pool[int(i)] for i in pick)
    return out


@torch.no_grad()
def evidence_edit_note(model, hook: HeadHook, pre: Prefill, note: NoteInput, events: Sequence[Event], *,
                       inventory: Mapping[str, str], settings: EditSettings) -> list[dict]:
    """The note edits of one note's selected P2C events (the same subset as the prefix edits); one row
    per edited event, in position order.  `inventory`: code -> description.  `pre`'s cache is
    overwritten from the earliest edited note token on."""
    occurrences = note_word_occurrences(note)
    in_note = set(occurrences)
    groups: dict[tuple[str, str], list[Event]] = {}
    for e in select_events(events, seed=settings.seed, note_id=note.note_id, max_events=settings.max_events):
        groups.setdefault((e.code, e.near_miss), []).append(e)
    rows, jobs = [], []
    for (code, near_miss), group in groups.items():
        sets = evidence_word_sets(code, near_miss, inventory, in_note, seed=settings.seed, note_id=note.note_id)
        if not sets["evidence"]:
            continue
        edited = {v: word_tokens(note.offsets, [span for w in ws for span in occurrences[w]])
                  for v, ws in sets.items() if ws}
        edited = {v: toks for v, toks in edited.items() if toks}
        group_rows = [{"pos": e.pos, "code": code, "near_miss": near_miss, "words": dict(sets),
                       "edited_tokens": {v: len(edited.get(v, [])) for v in NOTE_VARIANTS},
                       "margin_identity": None, "margin": {v: None for v in NOTE_VARIANTS}} for e in group]
        rows += group_rows
        if not edited:
            continue
        starts = {v: toks[0] for v, toks in edited.items()}
        starts["identity"] = min(starts.values())
        for v, start in starts.items():
            jobs.append((start, v, edited.get(v, []), group, group_rows))
    for start, name, toks, group, group_rows in sorted(jobs, key=lambda j: -j[0]):
        rows_q = [e.pos - 1 for e in group]
        seq = edited_ids(note.ids, toks, settings.filler_id)[start:max(rows_q) + 1]
        with _variant_writes(pre.cache, start):
            logits = _append(model, hook, pre.cache, seq, start, rows_q)
        for e, row, lg in zip(group, group_rows, logits):
            m = float(margin(lg, e.target_id, e.competitor_ids))
            if name == "identity":
                row["margin_identity"] = m
            else:
                row["margin"][name] = m
    return sorted(rows, key=lambda r: r["pos"])


def edited_ids(ids: Sequence[int], tokens: Sequence[int], filler_id: int) -> list[int]:
    """ids with every token in `tokens` replaced by the filler (the note-edit variant, whole)."""
    out = list(ids)
    for j in tokens:
        out[j] = int(filler_id)
    return out
