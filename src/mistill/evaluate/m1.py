"""M1 (App. K): the student's own margin at the teacher's decision events.

On the teacher's test traces, teacher-forced, at every teacher P1 / P2 / P2C event the student
realises (re-derived in its own tokenizer by the anchor rule of App. I.1; for SmolLM3 these are
chunk-level decisions), margin = logit(target) - logsumexp(logits of the competitors) with the
student's own target and competitor ids.  Reported per kind as P(margin > 0) over all events and
as the median margin; per note, the share of positive margins (what the paired tests use).

The NULL control (App. K: "NULL events are a control and stay near zero for every arm (0.011 to
0.019)"): at the teacher's NULL events (prose positions with a random letter as target), realised by
the same anchor rule with the letters as the student's own single tokens
(`alignment.realize_null_events`), the same margin; nothing is decided there, so P(margin > 0) stays
near zero.  Read from the same forward as the decisions, when asked (`null_control`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from mistill.distill import buckets as bk
from mistill.distill.alignment import KINDS, CompetitorMap, realize_null_events
from mistill.distill.mechanism import note_view
from mistill.distill.objective import event_margins
from mistill.distill.targets import competitor_strings, load_events
from mistill.io import read_jsonl

NULL = "NULL"


@torch.no_grad()
def note_margins(model, tokenizer, prompt: str, completion: str, events: list[dict],
                 teacher_tokenizer=None, null_events: list[dict] = ()) -> list[tuple[str, float]]:
    """(kind, margin) at each event the model realises; the NULL events' rows after the decisions'."""
    teacher = teacher_tokenizer or tokenizer
    comps = competitor_strings(teacher, events)
    view = note_view(tokenizer, bk.build_axis(prompt, completion), events, comps)
    nulls = realize_null_events(list(null_events), competitor_strings(teacher, list(null_events)),
                                [teacher.decode([int(e["target_id"])]) for e in null_events],
                                offsets=view.offsets, text=view.text, completion_at=view.completion_at,
                                competitor_map=CompetitorMap(tokenizer)) if null_events else []
    realized = [*view.realized, *nulls]
    if not realized:
        return []
    device = next(model.parameters()).device
    logits = model(input_ids=torch.tensor([view.ids], device=device)).logits[0].float()
    rows = torch.tensor([ev.row for ev in realized], device=device)
    margins = event_margins(logits.index_select(0, rows), torch.tensor([ev.target_id for ev in realized]),
                            [list(ev.competitor_ids) for ev in realized])
    return [(ev.kind, float(m)) for ev, m in zip(realized, margins.tolist())]


def summarise(per_note: dict[str, list[tuple[str, float]]], kinds: tuple[str, ...] = KINDS) -> dict:
    out: dict = {}
    for kind in kinds:
        values = np.array([m for rows in per_note.values() for k, m in rows if k == kind])
        shares = {n: float(np.mean([m > 0 for k, m in rows if k == kind]))
                  for n, rows in per_note.items() if any(k == kind for k, _ in rows)}
        out[kind] = {"p_margin_positive": float((values > 0).mean()) if len(values) else float("nan"),
                     "median_margin": float(np.median(values)) if len(values) else float("nan"),
                     "events": len(values), "per_note_share": shares}
    return out


def m1(model, tokenizer, traces: list[dict], events_dir: Path, teacher_tokenizer=None, *,
       null_control: bool = False) -> dict:
    """Per kind (and NULL with `null_control`): P(margin > 0), the median margin, events, per-note shares."""
    per_note = {}
    for trace in tqdm(traces, desc="M1", unit="note"):
        path = events_dir / trace["note_id"] / "events.jsonl"
        events = load_events(path, trace["note_id"])
        nulls = [e for e in read_jsonl(path) if e.get("kind") == NULL] if null_control else []
        per_note[trace["note_id"]] = note_margins(model, tokenizer, trace["prompt"], trace["completion"], events,
                                                  teacher_tokenizer, nulls)
    return summarise(per_note, (*KINDS, NULL) if null_control else KINDS)
