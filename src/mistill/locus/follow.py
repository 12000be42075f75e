"""Follow-through: how much of the window's decision carries to the code letter (App. F, Table 31; R-C12).

Ablating the prose-time heads over the window removes the *forced* chapter margin (the margin after the
forcing suffix, pass B).  Whether the trace still needs that decision is read at the letter itself: the
same heads are mean-ablated over the window positions [start, locus), the trace's own continuation is
teacher-forced from the locus to the letter, and the *natural* margin is read where the letter is
emitted (the P1 event's own target and competitors).  Per window-decided mention, one batch of
sequences (`forward_sequences`), each the window and the continuation:

    clean        nothing ablated: the trace's natural margin at the letter
    prose        the fixed prose-time top-K at the window positions           (natural drop)
    random       K random heads at the window positions                       (its floor)
    sustained    the prose-time top-K at every position from the window to the letter
    emission     the emission (P1) top-K at the letter's own input position only

and the forced drop of the same prose-time ablation (window + suffix, as pass B) beside it.

    follow-through ratio = median natural drop / median forced drop,

over the mentions whose forced drop exceeds `min_forced_drop` (the paper's 1 nat; our reading of "ratio"
as a ratio of the two medians, the Table 31 body being lost).  A decision *flips* when the ablated
natural margin falls below zero while the clean one is above it.  The paper's pre-registered reading:
below 0.25 the chapter is "elicited, not needed" at the window; 0.25-0.5 "partly decided".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from mistill.instrument.hook import HeadHook, Replacement
from mistill.locus.probe import ForcedTarget, forward_sequences
from mistill.locus.window import Window, ablated_margins

VARIANTS = ("clean", "prose", "random", "sustained", "emission")


def continuation_masks(window: Window, n_continuation: int, sets: dict[str, list[int]], n_layers: int,
                       n_heads: int) -> list[torch.Tensor]:
    """[L, W + C, H] masks of the five variants over the sequence window + continuation (C tokens)."""
    width, total = len(window.tokens), len(window.tokens) + n_continuation
    masks = []
    for name in VARIANTS:
        mask = torch.zeros(n_layers, total, n_heads, dtype=torch.bool)
        heads = sets.get(name, [])
        at = {"clean": slice(0, 0), "prose": slice(0, width), "random": slice(0, width),
              "sustained": slice(0, total), "emission": slice(total - 1, total)}[name]
        for flat in heads:
            mask[int(flat) // n_heads, at, int(flat) % n_heads] = True
        masks.append(mask)
    return masks


@torch.no_grad()
def follow_mention(model, hook: HeadHook, cache, mu: torch.Tensor, ids: Sequence[int], window: Window, pos: int,
                   natural: ForcedTarget, sets: dict[str, list[int]]) -> dict:
    """The natural margins of the five variants and the forced drop of the prose-time window ablation.

    `pos` is the letter's index (its logits are read at pos - 1); `sets` holds "prose", "random",
    "emission" (flat heads); "sustained" takes the prose-time heads.
    """
    sets = {**sets, "sustained": sets["prose"]}
    continuation = [int(t) for t in ids[window.cut:pos]]
    sequence = list(window.tokens) + continuation
    masks = continuation_masks(window, len(continuation), sets, hook.n_layers, hook.n_heads)
    logits = forward_sequences(model, hook, cache, [window.start] * len(masks), [sequence] * len(masks),
                               Replacement(torch.cat(masks, dim=1), mu))
    margins = {name: float(natural.margin(logits[b])) for b, name in enumerate(VARIANTS)}
    forced_clean, forced = ablated_margins(model, hook, cache, mu, window, [(sets["prose"], "window")], max_batch=2)
    return {"natural": margins, "forced_clean": forced_clean, "forced_drop": forced_clean - float(forced[0])}


def natural_drops(rows: Sequence[dict], variant: str) -> np.ndarray:
    """Clean minus ablated natural margin of one variant, per mention."""
    return np.array([r["natural"]["clean"] - r["natural"][variant] for r in rows], dtype=np.float64)


def follow_through_ratio(rows: Sequence[dict], min_forced_drop: float) -> tuple[float, float, float, int]:
    """(ratio, median natural drop, median forced drop, mentions) over mentions whose forced drop exceeds the cut."""
    kept = [r for r in rows if r["forced_drop"] > min_forced_drop]
    if not kept:
        return float("nan"), float("nan"), float("nan"), 0
    natural = float(np.median(natural_drops(kept, "prose")))
    forced = float(np.median([r["forced_drop"] for r in kept]))
    return natural / forced, natural, forced, len(kept)


def flipped(rows: Sequence[dict], variant: str = "prose") -> int:
    """Mentions whose natural decision the ablation flips (clean margin > 0, ablated < 0)."""
    return sum(r["natural"]["clean"] > 0 > r["natural"][variant] for r in rows)

