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
from mistill.distill.objective import contribution, event_margins, margin_direction, region_mass
from mistill.distill.pooled_attention import LayerInputCapture, pooled_rows
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


def _bucket_rows(view: NoteView, events: list[dict], realized: list[RealizedEvent], device) -> torch.Tensor:
    axis = view.tokens.axis
    index = np.stack([view.tokens.carved_index(bk.carve_ranges(axis, events[ev.index])) for ev in realized]) \
        if realized else np.zeros((0, len(view.ids)), dtype=np.int64)
    return torch.from_numpy(index).to(device)


def mechanism(model, view: NoteView, events: list[dict], capture: LayerInputCapture, pools: dict[str, Pool],
              window_pool: Pool | None, window: int, *, row_chunk: int = 256,
              use_checkpoint: bool = True) -> dict:
    """The pooled quantities after a forward pass that ran with `capture` active.

    Returns {phase: {"rows", "m", "c", "margin", "event_index"}, "window": {"rows", "event_index",
    "distance"}}, tensors on the model's device; gradients flow when grad mode is on.
    """
    device = next(model.parameters()).device
    axis = view.tokens.axis
    n_buckets = axis.n_buckets
    out: dict = {}
    final = capture.final_input[0]
    for phase in PHASES:
        realized = [ev for ev in view.realized if ev.kind == phase]
        if not realized:
            out[phase] = None
            continue
        rows = torch.tensor([ev.row for ev in realized], device=device)
        bucket_index = _bucket_rows(view, events, realized, device)
        layer_pools = [lp.to_device(device) for lp in pools[phase].by_layer()]
        pooled, writes = pooled_rows(model, capture, layer_pools, rows, bucket_index, n_buckets,
                                     with_writes=True, row_chunk=row_chunk, use_checkpoint=use_checkpoint)
        regions = torch.from_numpy(np.stack([bk.region_mask(axis, events[ev.index], phase != "P1")
                                             for ev in realized])).to(device)
        with torch.no_grad():
            h = final.index_select(0, rows)
            norm = model.model.norm
            logits = model.lm_head(norm(h)).float()
            targets = torch.tensor([ev.target_id for ev in realized], device=device)
            comps = [list(ev.competitor_ids) for ev in realized]
            margins = event_margins(logits, targets, comps)
            direction = margin_direction(h, norm.weight, norm.variance_epsilon, model.lm_head.weight,
                                         targets, comps, logits)
        weights = torch.cat([lp.weights for lp in layer_pools]).to(device)
        c = contribution(writes, weights, direction, margins)
        out[phase] = {"rows": pooled, "m": region_mass(pooled, regions), "c": c, "margin": margins,
                      "event_index": torch.tensor([ev.index for ev in realized])}
    out["window"] = None
    p1 = [ev for ev in view.realized if ev.kind == "P1"]
    if window > 0 and window_pool is not None and p1:
        pairs = [(ev.index, ev.row - r, r) for ev in p1 for r in window_rows(ev.row, window)]
        rows = torch.tensor([r for _, _, r in pairs], device=device)
        base = torch.from_numpy(view.tokens.base_index).to(device)
        layer_pools = [lp.to_device(device) for lp in window_pool.by_layer()]
        pooled, _ = pooled_rows(model, capture, layer_pools, rows, base, n_buckets, row_chunk=row_chunk,
                                use_checkpoint=use_checkpoint)
        out["window"] = {"rows": pooled, "event_index": torch.tensor([i for i, _, _ in pairs]),
                         "distance": torch.tensor([d for _, d, _ in pairs])}
    return out
