"""The forcing probe and the walk-back to the prose locus (Sec. 3.4, App. F "Forcing probe").

A chapter letter is *decided* at a position p when the model, cut there and asked for a code,
already names that chapter.  The probe crops the clean prefill's cache to [0, p), appends a
suffix that makes the model name a code (params `locus.suffix`; the paper's suffix B is
"\\nSo the code here is") and reads the chapter margin at the suffix's last token:

    m(d) = logit(prefix + letter) - logsumexp(logits of prefix + every other inventory letter)

with d = pos - p the distance of the cut from the letter (d = 0: everything before the letter
is kept) and `prefix` the spacing the suffix leaves before the letter (params `locus.letter_prefix`).

The walk-back, per chapter mention (a P1 event):

1. m(0) < theta: the probe fails (never decisive).
2. Step back d = step, 2 step, ... (at most `max_back` tokens, never past the trace's first token)
   until m first drops below theta; then `extra_steps` more steps record the curve's shape.
3. Refine the last crossing token by token (a linear scan of the step, METHOD-GUIDE's reading):
   the locus distance is the largest d such that every probed cut from the letter back to it
   stays >= theta.

Outcomes: *code* (d = 0); *window* (d >= 1 and the locus lies after the end of the previous code
mention); *inherited* (at or before the previous code's end; for the first code of a trace, the
trace's start: the note alone decides); *censored* (still decisive `max_back` tokens back);
*never* (the probe failure of step 1).

Probes never overwrite the prefill: every probe's tokens are written after the whole cache and see
only [0, p) of it and themselves, causally (`forward_sequences`), so probes of any cut, in any order,
share one cache and one forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from mistill.instrument.hook import HeadHook, Replacement
from mistill.instrument.margin import margin
from mistill.instrument.patching import _device, _fp32, crop_to

OUTCOMES = ("window", "code", "inherited", "censored", "never")


def sequences_mask(cuts: Sequence[int], lengths: Sequence[int], n_cached: int, dtype: torch.dtype,
                   device) -> torch.Tensor:
    """[1, 1, N, n_cached + N] additive mask for sequences written after the cache: token s of sequence b
    sees the cache [0, cuts[b]) and tokens 0..s of its own sequence."""
    total = sum(lengths)
    owner = torch.repeat_interleave(torch.arange(len(lengths), device=device), torch.as_tensor(lengths, device=device))
    index = torch.arange(total, device=device)
    cut_of = torch.as_tensor(list(cuts), device=device)[owner]
    sees_cache = torch.arange(n_cached, device=device)[None, :] < cut_of[:, None]
    sees_own = (owner[:, None] == owner[None, :]) & (index[None, :] <= index[:, None])
    visible = torch.cat([sees_cache, sees_own], dim=1)
    mask = torch.zeros(total, n_cached + total, dtype=dtype, device=device)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]


def forward_sequences(model, hook: HeadHook, cache, cuts: Sequence[int], sequences: Sequence[Sequence[int]],
                      replacement: Replacement | None = None) -> torch.Tensor:
    """Logits [B, V] at the last token of each sequence; sequence b is read as if it followed [0, cuts[b]).

    The sequences are written after the whole cache (RoPE positions cuts[b], cuts[b] + 1, ...), so the
    prefill's keys are never overwritten and the cache is back at its length afterwards.  Gradients flow
    when the caller enables them (the cache itself is a constant).  `replacement.mask` is [L, N, H] over
    the N = sum of lengths tokens, in order.
    """
    n_cached = cache.get_seq_length()
    lengths = [len(s) for s in sequences]
    if min(lengths) < 1 or max(cuts) > n_cached or min(cuts) < 0:
        raise ValueError("forward_sequences: empty sequence, or a cut outside the cache")
    device = _device(model)
    tokens = torch.as_tensor([int(t) for s in sequences for t in s], device=device)[None]
    positions = torch.as_tensor([c + i for c, n in zip(cuts, lengths) for i in range(n)], device=device)[None]
    mask = sequences_mask(cuts, lengths, n_cached, model.dtype, device)
    last = torch.as_tensor(lengths, device=device).cumsum(0) - 1
    try:
        with hook.replacing(replacement):
            out = model(input_ids=tokens, position_ids=positions, attention_mask=mask, past_key_values=cache,
                        use_cache=True, logits_to_keep=last)
    finally:
        crop_to(cache, n_cached)
    return _fp32(out.logits[0])


@dataclass(frozen=True)
class ForcedTarget:
    """The letter eventually emitted and its competitors, as single tokens after the suffix."""

    target_id: int
    competitor_ids: tuple[int, ...]

    def margin(self, logits: torch.Tensor) -> torch.Tensor:
        return margin(logits, self.target_id, self.competitor_ids)


def forced_targets(letter_ids: dict[str, int]) -> dict[str, ForcedTarget]:
    """letter -> its ForcedTarget, from the single-token ids of prefix + letter of every inventory letter."""
    return {letter: ForcedTarget(tid, tuple(o for other, o in sorted(letter_ids.items()) if other != letter))
            for letter, tid in letter_ids.items()}


@dataclass
class ProbeMention:
    """One chapter mention to walk back from: the letter at `pos`, cuts never below `floor` (the trace's
    first token), `previous_end` the token index just after the previous code mention (or `floor`)."""

    event: int
    pos: int
    floor: int
    previous_end: int
    target: ForcedTarget


@dataclass
class LocusResult:
    event: int
    outcome: str
    distance: int | None          # d of the locus (None: never decisive)
    jump: float | None            # m(d) - m(d + 1) across the refined crossing (None without a crossing)
    curve: dict[int, float] = field(default_factory=dict)   # every probed d -> its forced margin
    event_pos: int = 0

    @property
    def locus(self) -> int | None:
        """The cut position of the locus: tokens [0, locus) decide the chapter."""
        return None if self.distance is None else self.event_pos - self.distance

    def to_json(self) -> dict:
        return {"event": self.event, "pos": self.event_pos, "outcome": self.outcome, "distance": self.distance,
                "jump": self.jump, "curve": {str(d): round(m, 6) for d, m in sorted(self.curve.items())}}


@dataclass(frozen=True)
class WalkSettings:
    theta: float = 2.0
    step: int = 8
    max_back: int = 512
    extra_steps: int = 4


Probe = Callable[[Sequence[tuple[ProbeMention, int]]], list[float]]


def walk_back(probe: Probe, mentions: Sequence[ProbeMention], settings: WalkSettings) -> list[LocusResult]:
    """The walk-back of every mention, probing all mentions' next cut together (rounds of one forward batch).

    `probe` takes (mention, d) pairs and returns the forced margins m(d) in that order.
    """
    theta, step = settings.theta, settings.step
    curves: dict[int, dict[int, float]] = {m.event: {} for m in mentions}

    def run(pairs: list[tuple[ProbeMention, int]]) -> None:
        pairs = [(m, d) for m, d in pairs if d not in curves[m.event]]
        for (m, d), value in zip(pairs, probe(pairs) if pairs else []):
            curves[m.event][d] = float(value)

    def furthest(m: ProbeMention) -> int:
        return min(settings.max_back, m.pos - m.floor)

    def coarse_after(m: ProbeMention, d: int) -> int | None:
        """The next coarse cut beyond d: d + step, or the trace's start / max_back if that comes first."""
        if d >= furthest(m):
            return None
        return min(d + step, furthest(m))

    run([(m, 0) for m in mentions])
    walking = {m.event: 0 for m in mentions if curves[m.event][0] >= theta}
    crossings: dict[int, tuple[int, int]] = {}         # event -> (last decisive coarse d, first failing d)
    ends: dict[int, str] = {}                            # event -> "start" | "max" (no crossing)
    by_event = {m.event: m for m in mentions}
    while walking:
        pairs = []
        for event, d in list(walking.items()):
            nxt = coarse_after(by_event[event], d)
            if nxt is None:
                ends[event] = "max" if d >= settings.max_back else "start"
                del walking[event]
            else:
                pairs.append((by_event[event], nxt))
        run(pairs)
        for m, d in pairs:
            if curves[m.event][d] < theta:
                crossings[m.event] = (walking.pop(m.event), d)
            else:
                walking[m.event] = d
    # the crossing step token by token, and the curve's shape beyond it, in one batch
    refine = []
    for event, (good, bad) in crossings.items():
        m = by_event[event]
        refine += [(m, d) for d in range(good + 1, bad)]
        refine += [(m, d) for d in range(bad + step, bad + step * settings.extra_steps + 1, step) if d <= furthest(m)]
    run(refine)

    results = []
    for m in mentions:
        curve = curves[m.event]
        if curve[0] < theta:
            results.append(LocusResult(m.event, "never", None, None, curve, event_pos=m.pos))
            continue
        if m.event in crossings:
            good, bad = crossings[m.event]
            first_fail = next(d for d in range(good + 1, bad + 1) if d in curve and curve[d] < theta)
            distance, jump = first_fail - 1, curve[first_fail - 1] - curve[first_fail]
        else:
            distance, jump = max(d for d in curve if d <= furthest(m)), None
        results.append(LocusResult(m.event, classify(m, distance, ends.get(m.event)), distance, jump, curve,
                                   event_pos=m.pos))
    return results


def classify(mention: ProbeMention, distance: int, end: str | None) -> str:
    """The outcome of a decisive mention whose locus lies `distance` tokens before its letter."""
    if distance == 0:
        return "code"
    if end == "max":
        return "censored"
    if mention.pos - distance <= mention.previous_end:
        return "inherited"
    return "window"
