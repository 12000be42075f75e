"""M1 (App. K): the student's own margin at the teacher's decision events.

On the teacher's test traces, teacher-forced, at every teacher P1 / P2 / P2C event the student
realises (re-derived in its own tokenizer by the anchor rule of App. I.1; for SmolLM3 these are
chunk-level decisions), margin = logit(target) - logsumexp(logits of the competitors) with the
student's own target and competitor ids.  Reported per kind as P(margin > 0) over all events and
as the median margin; per note, the share of positive margins (what the paired tests use).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from mistill.distill import buckets as bk
from mistill.distill.alignment import KINDS
from mistill.distill.mechanism import note_view
from mistill.distill.objective import event_margins
from mistill.distill.targets import competitor_strings, load_events


@torch.no_grad()
def note_margins(model, tokenizer, prompt: str, completion: str, events: list[dict],
                 teacher_tokenizer=None) -> list[tuple[str, float]]:
    """(kind, margin) at each event the model realises."""
    comps = competitor_strings(teacher_tokenizer or tokenizer, events)
    view = note_view(tokenizer, bk.build_axis(prompt, completion), events, comps)
    if not view.realized:
        return []
    device = next(model.parameters()).device
    logits = model(input_ids=torch.tensor([view.ids], device=device)).logits[0].float()
    rows = torch.tensor([ev.row for ev in view.realized], device=device)
    margins = event_margins(logits.index_select(0, rows), torch.tensor([ev.target_id for ev in view.realized]),
                            [list(ev.competitor_ids) for ev in view.realized])
    return [(ev.kind, float(m)) for ev, m in zip(view.realized, margins.tolist())]


def summarise(per_note: dict[str, list[tuple[str, float]]]) -> dict:
    out: dict = {}
    for kind in KINDS:
        values = np.array([m for rows in per_note.values() for k, m in rows if k == kind])
        shares = {n: float(np.mean([m > 0 for k, m in rows if k == kind]))
                  for n, rows in per_note.items() if any(k == kind for k, _ in rows)}
        out[kind] = {"p_margin_positive": float((values > 0).mean()) if len(values) else float("nan"),
                     "median_margin": float(np.median(values)) if len(values) else float("nan"),
                     "events": len(values), "per_note_share": shares}
    return out


def m1(model, tokenizer, traces: list[dict], events_dir: Path, teacher_tokenizer=None) -> dict:
    per_note = {}
    for trace in tqdm(traces, desc="M1", unit="note"):
        events = load_events(events_dir / trace["note_id"] / "events.jsonl", trace["note_id"])
        per_note[trace["note_id"]] = note_margins(model, tokenizer, trace["prompt"], trace["completion"], events,
                                                  teacher_tokenizer)
    return summarise(per_note)
