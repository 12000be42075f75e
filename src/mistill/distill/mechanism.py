"""One model's pooled quantities on one note: abar at every supervised row, m and c at every event.

Shared by the teacher precompute (once, without gradients) and the student's training step (with
gradients), so both sides are computed by the same code (App. I.1, I.5):

* event rows: each realised event's decision row q, pooled with its kind's pool, buckets carved
  at P2 / P2C (App. I.1);
* window rows: the W rows before each P1 event, pooled with `window_pool` (the teacher's
  prose-time set; the student's own P1 set: App. I.1, "The window, and its asymmetry");
* m (Eq. C) from the event rows and the chapter region, c (Eq. D) from the pooled heads' writes,
  the margin direction at q and the model's own margin.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mistill.distill import buckets as bk
from mistill.distill.alignment import CompetitorMap, RealizedEvent, realize_events, window_rows
from mistill.distill.objective import (
    competitor_matrix,
    contribution,
    event_margins,
    margin_direction,
    region_mass,
)
from mistill.distill.pooled_attention import RowRequest, SupervisedRows
from mistill.distill.pools import Pool

PHASES = ("P1", "P2", "P2C")


@dataclass
class NoteView:
    """One model's tokenisation of a note: ids, bucket index per token, realised events."""

    ids: list[int]
    offsets: list[tuple[int, int]]
    text: str
    completion_at: int          # character where the completion starts in the model text
    completion_token: int       # first token of the completion
    tokens: bk.TokenBuckets
    realized: list[RealizedEvent]


def note_view(tokenizer, axis: bk.BucketAxis, events: list[dict], competitor_strings: list[list[str]]) -> NoteView:
    prefix = tokenizer.chat_prompt(axis.prompt)
    text = prefix + axis.completion
    enc = tokenizer.encode(text)
    tokens = bk.token_buckets(axis, text, enc.offsets, prefix)
    realized = realize_events(events, competitor_strings, ids=enc.ids, offsets=enc.offsets, text=text,
                              completion_at=len(prefix), competitor_map=CompetitorMap(tokenizer))
    first = next((i for i, (s, _) in enumerate(enc.offsets) if s >= len(prefix)), len(enc.ids))
    return NoteView(enc.ids, enc.offsets, text, len(prefix), first, tokens, realized)


def supervised_layers(pools: dict[str, Pool], window_pool: Pool | None) -> list[int]:
    layers = {layer for pool in pools.values() for layer, _ in pool.heads}
    if window_pool is not None:
        layers |= {layer for layer, _ in window_pool.heads}
    return sorted(layers)


def _static_inputs(view: NoteView, events: list[dict], phase: str, device) -> dict:
    """What a phase's rows need that does not depend on the weights (rows, carved bucket index,
    region masks, target / competitor ids), built once per note and device and then reused."""
    cache = view.__dict__.setdefault("_static", {})
    key = (phase, str(device))
    if key not in cache:
        axis = view.tokens.axis
        realized = [ev for ev in view.realized if ev.kind == phase]
        index = np.stack([view.tokens.carved_index(bk.carve_ranges(axis, events[ev.index])) for ev in realized])
        # the chapter region of an event depends on its letter only: one mask per letter
        by_letter: dict[str, np.ndarray] = {}
        regions = []
        for ev in realized:
            letter = events[ev.index]["code"][:1]
            if letter not in by_letter:
                by_letter[letter] = bk.region_mask(axis, events[ev.index], phase != "P1")
            regions.append(by_letter[letter])
        cache[key] = {
            "rows": torch.tensor([ev.row for ev in realized], device=device),
            "bucket_index": torch.from_numpy(index).to(device),
            "regions": torch.from_numpy(np.stack(regions)).to(device),
            "targets": torch.tensor([ev.target_id for ev in realized], device=device),
            "competitors": competitor_matrix([list(ev.competitor_ids) for ev in realized], device),
            "event_index": torch.tensor([ev.index for ev in realized]),
        }
    return cache[key]


@dataclass
class MechanismPlan:
    """The row requests of one note (for SupervisedRows.arm) and what reading them back needs."""

    requests: list
    n_buckets: int
    static: dict
    window_pairs: list[tuple[int, int]]   # (event index, distance) per window row


def plan_rows(view: NoteView, events: list[dict], pools: dict[str, Pool], window_pool: Pool | None, window: int,
              device) -> MechanismPlan:
    """Event rows per kind (each with its kind's pool, carved at P2 / P2C) and the window rows
    before P1 events (with `window_pool`), as row requests on `device`."""
    requests, static = [], {}
    for phase in PHASES:
        if not any(ev.kind == phase for ev in view.realized):
            continue
        st = static[phase] = _static_inputs(view, events, phase, device)
        requests.append(RowRequest(phase, st["rows"], st["bucket_index"],
                                   [lp.to_device(device) for lp in pools[phase].by_layer()], with_writes=True))
    pairs: list[tuple[int, int]] = []
    p1 = [ev for ev in view.realized if ev.kind == "P1"]
    if window > 0 and window_pool is not None and p1:
        triples = [(ev.index, ev.row - r, r) for ev in p1 for r in window_rows(ev.row, window)]
        pairs = [(i, d) for i, d, _ in triples]
        cache = view.__dict__.setdefault("_static", {})
        base = cache.setdefault(("base", str(device)), torch.from_numpy(view.tokens.base_index).to(device))
        requests.append(RowRequest("window", torch.tensor([r for _, _, r in triples], device=device), base,
                                   [lp.to_device(device) for lp in window_pool.by_layer()]))
    return MechanismPlan(requests, view.tokens.axis.n_buckets, static, pairs)


def read_mechanism(model, plan: MechanismPlan, rows_hook: SupervisedRows, row: int = 0) -> dict:
    """m, c and the pooled rows after a forward that ran with `rows_hook` armed with `plan` (at batch
    row `row` of a forward that carried several notes).

    Returns {phase: {"rows", "m", "c", "margin", "event_index"} or None, "window": {"rows",
    "event_index", "distance"} or None}; gradients flow when the forward ran with grad enabled.
    """
    results = rows_hook.collect(row)
    final = rows_hook.final_stream(row)
    norm = model.model.norm
    out: dict = {}
    for phase in PHASES:
        if phase not in plan.static:
            out[phase] = None
            continue
        st = plan.static[phase]
        pooled, writes = results[phase]
        with torch.no_grad():
            h = final.index_select(0, st["rows"])
            logits = model.lm_head(norm(h)).float()
            margins = event_margins(logits, st["targets"], st["competitors"])
            direction = margin_direction(h, norm.weight, norm.variance_epsilon, model.lm_head.weight,
                                         st["targets"], st["competitors"], logits)
        request = next(r for r in plan.requests if r.key == phase)
        weights = torch.cat([lp.weights for lp in request.layer_pools])
        out[phase] = {"rows": pooled, "m": region_mass(pooled, st["regions"]),
                      "c": contribution(writes, weights, direction, margins), "margin": margins,
                      "event_index": st["event_index"]}
    out["window"] = None
    if "window" in results:
        out["window"] = {"rows": results["window"][0],
                         "event_index": torch.tensor([i for i, _ in plan.window_pairs]),
                         "distance": torch.tensor([d for _, d in plan.window_pairs])}
    return out
