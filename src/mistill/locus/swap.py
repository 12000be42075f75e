"""The residual swap (App. F "Swapping the residual stream", Figure 5; R-C12): where the chapter enters.

For each window-decided chapter mention (the *target*) that has a *donor*, a window-decided mention of
another chapter in the same note, the residual stream leaving decoder layer l is captured from the
donor's clean forward and written into the target's forward at one of three places:

    locus   the locus token, the last token before the cut
    tail    the last `tail` window positions, ending at the locus (the paper's 8)
    code    the code token, the input position whose logits emit the chapter letter

Two margins are read, each for the target's letter and for the donor's:

    forced   after the forcing suffix appended at the locus (the probe of pass A)
    natural  at the letter, the trace teacher-forced from the locus (as the follow-through reads it)

The code swap changes nothing the forced probe reads (the code token lies after the cut), so only its
natural margins are recorded.  Every grid layer and place of one mention runs in one batch of sequences
after the note's prefill cache (`forward_sequences`); the donor's residuals come from one clean forward
of its own window and continuation, so the swapped vectors are exactly what the donor computed there.

Reconstructions (the extraction lost Figure 5's body and the pass's selection rules):

* donor: the nearest window-decided mention of another chapter in the same note, the earlier one on a
  tie; its positions are aligned to the target's by their offset from the locus (locus, tail) and at
  the code token;
* grid: params `locus.swap.layers` (the paper names layers 4 to 28 in steps of 4);
* l*: the grid layer with the largest median forced drop under the tail swap (the forced data alone);
* transport ratio at l*: the median over mentions whose forced drop exceeds `locus.min_forced_drop` of
  the per-mention natural drop / forced drop ("0.48 in median over the 720 mentions");
* the mid-layer ratios: median natural drop / median forced drop under the tail swap at the grid layers
  of the prose-time band (params `locus.layers`), "the ratio of the median drops";
* flip layer: the first grid layer from which on the donor's letter wins the natural decision under the
  code swap (its median natural margin above zero at that layer and every deeper grid layer).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from mistill.instrument.hook import HeadHook
from mistill.locus.probe import ForcedTarget, forward_sequences
from mistill.locus.window import Window

PLACES = ("locus", "tail", "code")


class ResidualStreams:
    """Forward hooks on the decoder layers: read, or overwrite, the residual stream leaving layer l at chosen
    token indices of the packed input (batch row 0, the layout of `forward_sequences`)."""

    def __init__(self, model: torch.nn.Module):
        self.layers = model.model.layers
        self.captured: dict[int, torch.Tensor] | None = None
        self.capture_at: torch.Tensor | None = None
        self.writes: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._handles = [layer.register_forward_hook(self._make_hook(i)) for i, layer in enumerate(self.layers)]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _make_hook(self, layer: int):
        def hook(module, args, output):
            hidden = output[0] if isinstance(output, tuple) else output
            if layer in self.writes:
                at, values = self.writes[layer]
                hidden = hidden.clone()
                hidden[0, at] = values.to(hidden.dtype)
            if self.captured is not None:
                self.captured[layer] = hidden[0, self.capture_at].detach().clone()
            if layer not in self.writes:
                return None
            return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

        return hook

    @contextlib.contextmanager
    def capturing(self, at: Sequence[int]) -> Iterator[dict[int, torch.Tensor]]:
        """Yields a dict filled with each layer's residual [len(at), D] at the packed indices `at`."""
        self.captured, self.capture_at = {}, torch.as_tensor(list(at), dtype=torch.long)
        try:
            yield self.captured
        finally:
            self.captured, self.capture_at = None, None

    @contextlib.contextmanager
    def writing(self, writes: dict[int, tuple[Sequence[int], torch.Tensor]]) -> Iterator[None]:
        """layer -> (packed indices, values [n, D]): the residual leaving that layer is replaced there."""
        self.writes = {layer: (torch.as_tensor(list(at), dtype=torch.long), values)
                       for layer, (at, values) in writes.items() if len(at)}
        try:
            yield
        finally:
            self.writes = {}


@dataclass(frozen=True)
class SwapMention:
    """A window-decided mention as the swap reads it: its window (ending at the locus, with the forcing
    suffix and forced target), its letter's index and the natural target and competitors there."""

    window: Window
    pos: int
    natural: ForcedTarget

    def continuation(self, ids: Sequence[int]) -> tuple[int, ...]:
        return tuple(int(t) for t in ids[self.window.cut:self.pos])

    def natural_sequence(self, ids: Sequence[int]) -> tuple[int, ...]:
        return self.window.tokens + self.continuation(ids)


def donor_target(target: ForcedTarget, donor: ForcedTarget) -> ForcedTarget:
    """The donor's letter against the rest of the target's letter set (target letter included)."""
    letters = {target.target_id, *target.competitor_ids}
    return ForcedTarget(donor.target_id, tuple(sorted(letters - {donor.target_id})))


def place_offsets(place: str, window_len: int, sequence_len: int, tail: int) -> list[int]:
    """Indices within a sequence (window first) where a place sits."""
    if place == "locus":
        return [window_len - 1]
    if place == "tail":
        return list(range(window_len - min(tail, window_len), window_len))
    if place == "code":
        return [sequence_len - 1]
    raise ValueError(f"residual swap: unknown place {place!r}")


def _batched(model, hook: HeadHook, streams: ResidualStreams, cache, jobs: list[dict], max_batch: int) -> list:
    """Run jobs {cut, sequence, writes: [(layer, offsets, values)]} in batches; logits [V] per job."""
    out = []
    for begin in range(0, len(jobs), max_batch):
        chunk = jobs[begin:begin + max_batch]
        starts = np.cumsum([0] + [len(j["sequence"]) for j in chunk])
        writes: dict[int, tuple[list[int], list[torch.Tensor]]] = {}
        for j, s in zip(chunk, starts):
            for layer, offsets, values in j["writes"]:
                at, vals = writes.setdefault(layer, ([], []))
                at += [int(s) + o for o in offsets]
                vals.append(values)
        with streams.writing({layer: (at, torch.cat(vals)) for layer, (at, vals) in writes.items()}):
            logits = forward_sequences(model, hook, cache, [j["cut"] for j in chunk], [j["sequence"] for j in chunk])
        out += list(logits)
    return out


@torch.no_grad()
def swap_mention(model, hook: HeadHook, streams: ResidualStreams, cache, ids: Sequence[int], target: SwapMention,
                 donor: SwapMention, layers: Sequence[int], tail: int, max_batch: int) -> dict:
    """Forced and natural margins (target letter, donor letter) of the clean target and of every swap.

    Returns {"forced": {"clean": [t, d], "locus": [[t, d] per layer], "tail": [...]},
             "natural": {"clean": [t, d], "locus": [...], "tail": [...], "code": [...]}}.
    """
    layers = [int(layer) for layer in layers]
    # the donor's clean residuals at its own locus, tail and code token, every grid layer
    donor_sequence = donor.natural_sequence(ids)
    width = len(donor.window.tokens)
    donor_at = {p: place_offsets(p, width, len(donor_sequence), tail) for p in PLACES}
    flat = [o for p in PLACES for o in donor_at[p]]
    with streams.capturing(flat) as captured:
        forward_sequences(model, hook, cache, [donor.window.start], [donor_sequence])
    slices, begin = {}, 0
    for p in PLACES:
        slices[p] = slice(begin, begin + len(donor_at[p]))
        begin += len(donor_at[p])

    forced_sequence, natural_sequence = target.window.sequence, target.natural_sequence(ids)
    width = len(target.window.tokens)
    jobs = [{"kind": ("forced", "clean"), "sequence": forced_sequence, "writes": []},
            {"kind": ("natural", "clean"), "sequence": natural_sequence, "writes": []}]
    for place in PLACES:
        kinds = ("natural",) if place == "code" else ("forced", "natural")
        for kind in kinds:
            sequence = forced_sequence if kind == "forced" else natural_sequence
            offsets = place_offsets(place, width, len(sequence), tail)
            for layer in layers:
                values = captured[layer][slices[place]]
                n = min(len(offsets), values.shape[0])           # a window clipped at the trace start
                jobs.append({"kind": (kind, place), "sequence": sequence,
                             "writes": [(layer, offsets[len(offsets) - n:], values[values.shape[0] - n:])]})
    for job in jobs:
        job["cut"] = target.window.start
    logits = _batched(model, hook, streams, cache, jobs, max_batch)
    forced_donor = donor_target(target.window.target, donor.window.target)
    natural_donor = donor_target(target.natural, donor.natural)
    out: dict[str, dict[str, list]] = {"forced": {}, "natural": {}}
    for job, row in zip(jobs, logits):
        kind, place = job["kind"]
        pair = ((target.window.target, forced_donor) if kind == "forced" else (target.natural, natural_donor))
        margins = [float(t.margin(row)) for t in pair]
        if place == "clean":
            out[kind]["clean"] = margins
        else:
            out[kind].setdefault(place, []).append(margins)
    return out


def nearest_donor(targets: Sequence[tuple[int, str]], i: int) -> int | None:
    """Index of the nearest (position) mention of another chapter than mention i, the earlier on a tie.

    `targets` is [(letter position, chapter letter)] of one note's window-decided mentions."""
    pos, letter = targets[i]
    others = [(abs(p - pos), p > pos, j) for j, (p, c) in enumerate(targets) if c != letter]
    return min(others)[2] if others else None


# ---- what the reader computes from the swap rows ----------------------------------------------------


def drops(rows: Sequence[dict], kind: str, place: str, layer_index: int) -> np.ndarray:
    """Target-letter margin drop (clean - swapped) per mention at one grid layer."""
    return np.array([r[kind]["clean"][0] - r[kind][place][layer_index][0] for r in rows], dtype=np.float64)


def donor_gain(rows: Sequence[dict], kind: str, place: str, layer_index: int) -> np.ndarray:
    """Donor-letter margin rise (swapped - clean) per mention at one grid layer."""
    return np.array([r[kind][place][layer_index][1] - r[kind]["clean"][1] for r in rows], dtype=np.float64)


def analysis_layer(rows: Sequence[dict], layers: Sequence[int]) -> int:
    """l*: the grid layer with the largest median forced drop under the tail swap."""
    medians = [float(np.median(drops(rows, "forced", "tail", i))) for i in range(len(layers))]
    return int(layers[int(np.argmax(medians))])


def transport_ratio(rows: Sequence[dict], layer_index: int, min_forced_drop: float) -> tuple[float, int]:
    """Median per-mention natural / forced drop under the tail swap, mentions with forced drop > cut."""
    forced = drops(rows, "forced", "tail", layer_index)
    natural = drops(rows, "natural", "tail", layer_index)
    kept = forced > min_forced_drop
    if not kept.any():
        return float("nan"), 0
    return float(np.median(natural[kept] / forced[kept])), int(kept.sum())


def ratio_of_medians(rows: Sequence[dict], layer_index: int) -> float:
    """Median natural drop / median forced drop under the tail swap at one grid layer."""
    return float(np.median(drops(rows, "natural", "tail", layer_index))
                 / np.median(drops(rows, "forced", "tail", layer_index)))


def flip_layer(rows: Sequence[dict], layers: Sequence[int]) -> int | None:
    """The first grid layer from which on the donor's letter wins the natural decision under the code swap."""
    wins = [float(np.median([r["natural"]["code"][i][1] for r in rows])) > 0 for i in range(len(layers))]
    for i in range(len(layers)):
        if all(wins[i:]):
            return int(layers[i])
    return None
