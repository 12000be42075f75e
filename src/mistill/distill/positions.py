"""RandPos (App. M.1): the teacher's decision events moved to random positions of its own trace.

The control keeps everything of Mistill but where the loss looks: the student's own ranked heads, their
weights, both terms, λ, and each note's number of events per kind; only the rows move.  The paper does
not say how the positions are drawn, nor what the interaction term's margin means where no decision is
made.  The reading implemented here (METHOD-GUIDE §15, the recommended one):

* each P1 / P2 / P2C event moves to a completion token drawn uniformly without replacement, with a
  generator seeded by (position seed, note id), so a note's positions do not depend on which notes share
  its run; the position seed is the run's training seed (App. J.4: "a seed fixes ... RandPos' positions");
* candidates are completion tokens that are no event of the trace (of any kind, NULL included) and at which
  the event's competitor strings are single tokens of the teacher in the target token's spelling (the
  `CompetitorMap` rule realisation uses), so m and c are defined: m contrasts the token the teacher emits
  there with the event's competitors, exactly as at a true event; an event with no such candidate left is
  dropped (a note keeps the events it can place);
* the moved event keeps its kind and code, so its row is read with its kind's pool and carved over the same
  code's lines and earlier mentions; no mention of the code is under way at a random position, so its prefix
  slot is empty; its P1 window rows follow it.

Teacher targets are then computed at the new rows like any others (`targets.compute_targets`).
"""

from __future__ import annotations

import hashlib

import numpy as np

from mistill.distill import buckets as bk
from mistill.distill.alignment import KINDS, CompetitorMap, decision_row
from mistill.distill.mechanism import note_view


def note_generator(position_seed: int, note_id: str) -> np.random.Generator:
    """One generator per (seed, note): a note's draw never depends on the others'."""
    digest = int.from_bytes(hashlib.sha256(note_id.encode()).digest()[:8], "little")
    return np.random.default_rng([int(position_seed), digest])


def relocate_events(events: list[dict], competitors: list[list[str]], tokenizer, prompt: str, completion: str,
                    *, position_seed: int, note_id: str) -> list[dict]:
    """The P1 / P2 / P2C events of one trace at random completion positions (module docstring); NULL events and
    any other rows are returned unchanged, in the original order.  `competitors`: each event's competitor
    strings (`targets.competitor_strings`)."""
    # the teacher's own tokenization of the trace, as its targets pass sees it
    view = note_view(tokenizer, bk.build_axis(prompt, completion), events, competitors)
    ids, offsets, text, completion_at = view.ids, view.offsets, view.text, view.completion_at
    taken = {int(e["pos"]) for e in events if e.get("pos") is not None and int(e["pos"]) >= 0}
    for e in events:   # an event's own token, found from its anchor as realisation finds it
        q = decision_row(offsets, text, completion_at + int(e["anchor"])) if "anchor" in e else None
        if q is not None:
            taken.add(q + 1)
    candidates = [t for t in range(max(view.completion_token, 1), len(ids)) if t not in taken
                  and decision_row(offsets, text, offsets[t][0]) == t - 1]
    order = [candidates[i] for i in note_generator(position_seed, note_id).permutation(len(candidates))]
    competitor_map, used, out = CompetitorMap(tokenizer), set(), []
    for event, comps in zip(events, competitors):
        if event.get("kind") not in KINDS:
            out.append(event)
            continue
        for t in order:
            if t in used:
                continue
            s, e = offsets[t]
            competitor_ids = competitor_map.competitors(text[s:e], comps)
            if competitor_ids and ids[t] not in competitor_ids:
                used.add(t)
                out.append({**event, "pos": t, "anchor": s - completion_at, "target_id": int(ids[t]),
                            "competitors": list(comps), "prefix": "", "moved_from": event.get("pos")})
                break
    return out
