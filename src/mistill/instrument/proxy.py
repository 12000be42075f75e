"""The interaction term's contribution proxy c against exact single-head patches (Sec. 2.2, App. C; R-D20).

Mistill's interaction term (Sec. 4.1) matches m * c, where c is the pooled heads' direct-logit
projection on the margin direction as a share of the margin (Eq. D, `distill.objective.contribution`):

    c_e = sum_h w_h <z_h W_O^h, d_e> / max(|margin_e|, 0.1)

Per head, with weight 1, this is c_{e,h}; m_{e,h} is the head's own attention mass on the event's
chapter region (Eq. C with a one-head pool).  App. C asks how faithful c is: at every P2C event of
the faithfulness pass whose nominees were patched exactly (patch2.jsonl `p2c_exact`: the event's
top-k by |A_h| plus the global top, each head mean-ablated alone), the patched heads' c, m * c and
first-order importance are set against their exact importance.

The pass (`run_proxy`, stage HD-001-proxy): per note, one no-grad forward of the teacher over its
trace with every layer's input kept (`LayerInputCapture`); at the decision rows of every phase (P1, P2,
P2C), every head's attention row and write are rebuilt from the layer input (`attention_rows`, the code
the student's loss uses), the margin direction from the final norm's input (`margin_direction`).
Writes <out>/<note>/proxy.npz: kinds [E], positions [E] (the events' `pos`), occurrence [E] (how many
earlier events of the same kind share the position: one decision row can contrast against two
siblings), c [E, L, H], m [E, L, H], margin [E], target_logit [E] (the logit of the decided token:
R-C11 reads the bf16 grid at its magnitude).  R-D20 reads its P2C rows.

Direct-logit attribution in the full run (App. C, R-C2): "DLA ... is anticorrelated with first-order
attribution in the full run (median per-event Pearson -0.32)".  DLA is a head's write projected on the
margin direction, <z_h W_O^h, d_e>; c_{e,h} is that divided by max(|margin_e|, 0.1), a positive
constant per event, so the per-event Pearson of c with the attribution pass's first-order importance
over all heads is the Pearson of DLA with it.  The readouts (`proxy_faithfulness`,
`dla_vs_first_order`) are in `mistill.instrument.proxy_readout`, which needs no model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from mistill.errors import UserError
from mistill.instrument.proxy_readout import (
    ARTIFACT,
    DECISION_KINDS,
    MIN_MARGIN,
    load_proxy,
    occurrences_within_kind,
)
from mistill.io import read_jsonl, write_npz


def head_contributions(head_writes: torch.Tensor, direction: torch.Tensor, margin: torch.Tensor,
                       min_margin: float = MIN_MARGIN) -> torch.Tensor:
    """c_{e,h}: Eq. D for each head alone at weight 1 (`contribution` with a one-hot pool). -> [E, H]."""
    from mistill.distill.objective import contribution

    one_hot = torch.eye(head_writes.shape[1], device=head_writes.device)
    return torch.stack([contribution(head_writes, one_hot[h], direction, margin, min_margin)
                        for h in range(head_writes.shape[1])], dim=-1)


def head_region_mass(probs: torch.Tensor, bucket_index: torch.Tensor, regions: torch.Tensor,
                     n_buckets: int) -> torch.Tensor:
    """m_{e,h}: Eq. C for each head alone (a one-head pool).  probs [H, E, T] -> [E, H]."""
    from mistill.distill.objective import pool_bucket_attention, region_mass

    one = torch.ones(1, device=probs.device)
    return torch.stack([region_mass(pool_bucket_attention(probs[h:h + 1], bucket_index, one, n_buckets), regions)
                        for h in range(probs.shape[0])], dim=-1)


@torch.no_grad()
def note_proxy(model, tokenizer, prompt: str, completion: str, events: list[dict], *,
               kinds: Sequence[str] = ("P2C",), note_id: str = "?") -> dict[str, np.ndarray]:
    """Every head's c and m at the note's events of `kinds` (the arrays of proxy.npz)."""
    from mistill.distill import buckets as bk
    from mistill.distill.mechanism import note_view
    from mistill.distill.objective import competitor_matrix, event_margins, margin_direction
    from mistill.distill.pooled_attention import LayerInputCapture, attention_rows, decoder_layers
    from mistill.distill.targets import competitor_strings

    axis = bk.build_axis(prompt, completion)
    view = note_view(tokenizer, axis, events, competitor_strings(tokenizer, events))
    realized = [ev for ev in view.realized if ev.kind in kinds]
    n_layers = len(decoder_layers(model))
    n_heads = model.config.num_attention_heads
    if not realized:
        empty = np.zeros((0, n_layers, n_heads), dtype=np.float32)
        return {"kinds": np.zeros(0, dtype=str), "positions": np.zeros(0, dtype=np.int64),
                "occurrence": np.zeros(0, dtype=np.int64), "c": empty, "m": empty.copy(),
                "margin": np.zeros(0, dtype=np.float32), "target_logit": np.zeros(0, dtype=np.float32)}
    for ev in realized:   # the decision row q predicts the event's token at q + 1
        if events[ev.index].get("pos", -1) >= 0 and events[ev.index]["pos"] != ev.row + 1:
            raise UserError(f"note {note_id}: {ev.kind} event {ev.index} sits at token {events[ev.index]['pos']} but "
                            f"the teacher's tokenization decides at {ev.row + 1}; events and trace disagree")
    device = next(model.parameters()).device
    rows = torch.tensor([ev.row for ev in realized], device=device)
    bucket_index = torch.from_numpy(np.stack([view.tokens.carved_index(bk.carve_ranges(axis, events[ev.index]))
                                              for ev in realized])).to(device)
    # a chapter decision's region is its letter's lines; a character decision's, its code's (as in training)
    regions = torch.from_numpy(np.stack([bk.region_mask(axis, events[ev.index], ev.kind != "P1")
                                         for ev in realized])).to(device)
    targets = torch.tensor([ev.target_id for ev in realized], device=device)
    competitors = competitor_matrix([list(ev.competitor_ids) for ev in realized], device)

    capture = LayerInputCapture(model, range(n_layers))
    try:
        capture.start()
        model(input_ids=torch.tensor([view.ids], device=device))
        capture.stop()
        norm = model.model.norm
        final = capture.final_input[0].index_select(0, rows)
        logits = model.lm_head(norm(final)).float()
        margin = event_margins(logits, targets, competitors)
        direction = margin_direction(final, norm.weight, norm.variance_epsilon, model.lm_head.weight,
                                     targets, competitors, logits)
        heads = torch.arange(n_heads, device=device)
        c, m = [], []
        for idx, layer in enumerate(decoder_layers(model)):
            rotary = capture.rotary.get(idx)
            rotary = None if rotary is None else (rotary[0][0], rotary[1][0])
            probs, writes = attention_rows(layer, capture.inputs[idx][0], rotary, rows, heads, with_writes=True)
            c.append(head_contributions(writes, direction, margin))
            m.append(head_region_mass(probs, bucket_index, regions, axis.n_buckets))
    finally:
        capture.remove()
    occurrence = occurrences_within_kind(events)
    return {"kinds": np.asarray([ev.kind for ev in realized]),
            "positions": np.asarray([ev.row + 1 for ev in realized], dtype=np.int64),
            "occurrence": np.asarray([occurrence[ev.index] for ev in realized], dtype=np.int64),
            "c": torch.stack(c, dim=1).cpu().numpy().astype(np.float32),
            "m": torch.stack(m, dim=1).cpu().numpy().astype(np.float32),
            "margin": margin.cpu().numpy().astype(np.float32),
            "target_logit": logits.gather(1, targets[:, None])[:, 0].cpu().numpy().astype(np.float32)}


def run_proxy(cfg, params: dict, out_dir: Path, *, model=None, tokenizer=None, limit: int | None = None,
              force: bool = False) -> dict:
    """The pass over the notes of cfg.out_dir (HD-001): every head's c and m at each decision event."""
    from mistill.instrument.passes import (
        NotePass,
        commit_artifact,
        config_sha256,
        inputs_sha256,
        load_teacher,
        load_traces,
    )
    from mistill.io import provenance

    hd = Path(cfg.out_dir)
    traces = [t for t in load_traces(cfg.traces)[:limit] if (hd / t.note_id / "events.jsonl").is_file()]
    if not traces:
        raise UserError(f"{hd}: no note has events (run `mistill instrument all` first)")
    note_pass = NotePass("proxy", out_dir, ARTIFACT, load_proxy, force, config_sha256(cfg))
    for trace in tqdm(traces, desc="proxy", unit="note"):
        events_path = hd / trace.note_id / "events.jsonl"
        events = [e for e in read_jsonl(events_path) if e.get("kind") in DECISION_KINDS]
        if not events:
            note_pass.skip(trace.note_id, "no decision event")
            continue
        digest = inputs_sha256(trace.prompt, trace.completion, events_path)
        if not note_pass.needs(trace.note_id, digest):
            continue
        if model is None:
            model, tokenizer = load_teacher(cfg, params)
        arrays = note_proxy(model, tokenizer, trace.prompt, trace.completion, events, kinds=DECISION_KINDS,
                            note_id=trace.note_id)
        commit_artifact(note_pass.path(trace.note_id), lambda p, a=arrays: write_npz(p, **a),
                        {"config_sha256": config_sha256(cfg), "inputs_sha256": digest,
                         "provenance": provenance(params)})
        note_pass.computed += 1
    note_pass.finish(params)
    return {"notes": note_pass.done + note_pass.computed, "skipped": note_pass.skipped}
