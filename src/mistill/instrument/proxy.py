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
trace with every layer's input kept (`LayerInputCapture`); at the P2C decision rows, every head's
attention row and write are rebuilt from the layer input (`attention_rows`, the code the student's
loss uses), the margin direction from the final norm's input (`margin_direction`).  Writes
<out>/<note>/proxy.npz: positions [E] (the events' `pos`), occurrence [E] (how many earlier P2C events
share the position: one decision row can contrast against two siblings), c [E, L, H], m [E, L, H],
margin [E].

The readout (`proxy_faithfulness`), reconstructed from App. C's sentence (its table was lost):

* per event, Spearman and Pearson of c with the exact importance over the event's patched heads,
  and Spearman of first-order importance and of m * c with it; medians over events (events whose
  patched heads are fewer than three or constant in either vector have no correlation and are counted);
* pooled over events: each patched head's mean c (first-order, m * c) and mean exact importance over
  the events where it was patched, and the Spearman of the two across those heads ("across 395 heads");
* the magnitude: sum over patched (event, head) pairs of |c * max(|margin|, 0.1)| (the direct-logit
  effect in nats) over the sum of |exact importance| ("about a quarter of the exact effect").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from scipy import stats
from tqdm import tqdm

from mistill.errors import UserError
from mistill.io import read_jsonl, write_npz

MIN_MARGIN = 0.1          # Eq. D's floor on |margin|
MIN_HEADS = 3             # fewer patched heads than this: no per-event correlation
ARTIFACT = "proxy.npz"


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
               note_id: str = "?") -> dict[str, np.ndarray]:
    """Every head's c and m at the note's P2C events (the arrays of proxy.npz)."""
    from mistill.distill import buckets as bk
    from mistill.distill.mechanism import note_view
    from mistill.distill.objective import competitor_matrix, event_margins, margin_direction
    from mistill.distill.pooled_attention import LayerInputCapture, attention_rows, decoder_layers
    from mistill.distill.targets import competitor_strings

    axis = bk.build_axis(prompt, completion)
    view = note_view(tokenizer, axis, events, competitor_strings(tokenizer, events))
    realized = [ev for ev in view.realized if ev.kind == "P2C"]
    n_layers = len(decoder_layers(model))
    n_heads = model.config.num_attention_heads
    if not realized:
        empty = np.zeros((0, n_layers, n_heads), dtype=np.float32)
        return {"positions": np.zeros(0, dtype=np.int64), "occurrence": np.zeros(0, dtype=np.int64), "c": empty,
                "m": empty.copy(), "margin": np.zeros(0, dtype=np.float32)}
    for ev in realized:   # the decision row q predicts the event's token at q + 1
        if events[ev.index].get("pos", -1) >= 0 and events[ev.index]["pos"] != ev.row + 1:
            raise UserError(f"note {note_id}: P2C event {ev.index} sits at token {events[ev.index]['pos']} but the "
                            f"teacher's tokenization decides at {ev.row + 1}; events and trace disagree")
    device = next(model.parameters()).device
    rows = torch.tensor([ev.row for ev in realized], device=device)
    bucket_index = torch.from_numpy(np.stack([view.tokens.carved_index(bk.carve_ranges(axis, events[ev.index]))
                                              for ev in realized])).to(device)
    regions = torch.from_numpy(np.stack([bk.region_mask(axis, events[ev.index], True) for ev in realized])).to(device)
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
    occurrence = _occurrences([e for e in events if e.get("kind") == "P2C"])
    ordinal = {i: n for n, i in enumerate(i for i, e in enumerate(events) if e.get("kind") == "P2C")}
    return {"positions": np.asarray([ev.row + 1 for ev in realized], dtype=np.int64),
            "occurrence": np.asarray([occurrence[ordinal[ev.index]] for ev in realized], dtype=np.int64),
            "c": torch.stack(c, dim=1).cpu().numpy().astype(np.float32),
            "m": torch.stack(m, dim=1).cpu().numpy().astype(np.float32),
            "margin": margin.cpu().numpy().astype(np.float32)}


def load_proxy(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    for key in ("positions", "occurrence", "c", "m", "margin"):
        if key not in arrays:
            raise ValueError(f"missing array {key}")
    return arrays


def _occurrences(rows: Sequence[dict]) -> list[int]:
    """For each row in order, how many earlier rows share its position."""
    seen: dict[int, int] = {}
    out = []
    for row in rows:
        out.append(seen.get(int(row["pos"]), 0))
        seen[int(row["pos"])] = out[-1] + 1
    return out


def exact_rows(path: Path) -> list[dict]:
    """A note's P2C knock-in rows that carry exact single-head patches, each with its `occurrence`
    (rows follow the note's events, so (pos, occurrence) names the same event in proxy.npz)."""
    rows = [r for r in read_jsonl(path) if r.get("kind") == "P2C"]
    return [{**r, "occurrence": n} for r, n in zip(rows, _occurrences(rows)) if r.get("p2c_exact")]


def run_proxy(cfg, params: dict, out_dir: Path, *, model=None, tokenizer=None, limit: int | None = None,
              force: bool = False) -> dict:
    """The pass over the notes of cfg.out_dir (HD-001) whose P2C events were patched exactly."""
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
    traces = [t for t in load_traces(cfg.traces)[:limit] if (hd / t.note_id / "patch2.jsonl").is_file()]
    if not traces:
        raise UserError(f"{hd}: no note has knock-in rows (run `mistill instrument all` first)")
    note_pass = NotePass("proxy", out_dir, ARTIFACT, load_proxy, force, config_sha256(cfg))
    for trace in tqdm(traces, desc="proxy", unit="note"):
        patches, events_path = hd / trace.note_id / "patch2.jsonl", hd / trace.note_id / "events.jsonl"
        if not exact_rows(patches):
            note_pass.skip(trace.note_id, "no P2C event with exact patches")
            continue
        digest = inputs_sha256(trace.prompt, trace.completion, events_path, patches)
        if not note_pass.needs(trace.note_id, digest):
            continue
        if model is None:
            model, tokenizer = load_teacher(cfg, params)
        events = [e for e in read_jsonl(events_path) if e.get("kind") in ("P1", "P2", "P2C")]
        arrays = note_proxy(model, tokenizer, trace.prompt, trace.completion, events, note_id=trace.note_id)
        commit_artifact(note_pass.path(trace.note_id), lambda p, a=arrays: write_npz(p, **a),
                        {"config_sha256": config_sha256(cfg), "inputs_sha256": digest,
                         "provenance": provenance(params)})
        note_pass.computed += 1
    note_pass.finish(params)
    return {"notes": note_pass.done + note_pass.computed, "skipped": note_pass.skipped}


# ---- the readout ------------------------------------------------------------------------------------


def _correlation(test, x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < MIN_HEADS or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(test(x, y).statistic)


def proxy_faithfulness(patch_rows: Mapping[str, Sequence[dict]], proxies: Mapping[str, Mapping[str, np.ndarray]]
                       ) -> dict:
    """Per-event and pooled agreement of c, m * c and first-order importance with exact importance.

    patch_rows: note -> its P2C rows with `p2c_exact` (heads as flat layer * H + head indices);
    proxies: note -> proxy.npz arrays.  An event with exact patches but no proxy row is an error:
    the two passes disagree about the note's events.
    """
    per_event = {name: [] for name in ("c_spearman", "c_pearson", "mc_spearman", "first_order_spearman")}
    undefined = 0
    by_head: dict[int, dict[str, list[float]]] = {}
    dla_total = exact_total = 0.0
    n_events = 0
    for note, rows in patch_rows.items():
        arrays = proxies[note]
        index = {(int(p), int(k)): i for i, (p, k) in enumerate(zip(arrays["positions"], arrays["occurrence"]))}
        c_all = arrays["c"].reshape(arrays["c"].shape[0], -1)
        m_all = arrays["m"].reshape(arrays["m"].shape[0], -1)
        for row in rows:
            key = (int(row["pos"]), int(row["occurrence"]))
            if key not in index:
                raise UserError(f"note {note}: P2C event at {row['pos']} has exact patches but no proxy row; "
                                "rerun the proxy pass")
            e = index[key]
            heads = np.asarray(row["p2c_exact"]["heads"], dtype=int)
            exact = np.asarray(row["p2c_exact"]["exact"], dtype=float)
            first = np.asarray(row["p2c_exact"]["first_order"], dtype=float)
            c, m = c_all[e, heads].astype(float), m_all[e, heads].astype(float)
            n_events += 1
            pairs = {"c_spearman": (stats.spearmanr, c), "c_pearson": (stats.pearsonr, c),
                     "mc_spearman": (stats.spearmanr, m * c), "first_order_spearman": (stats.spearmanr, first)}
            values = {name: _correlation(test, x, exact) for name, (test, x) in pairs.items()}
            undefined += values["c_spearman"] is None
            for name, v in values.items():
                if v is not None:
                    per_event[name].append(v)
            for h, ex, ch, mh, fo in zip(heads.tolist(), exact, c, m, first):
                cell = by_head.setdefault(h, {"exact": [], "c": [], "mc": [], "first_order": []})
                for key, v in (("exact", ex), ("c", ch), ("mc", mh * ch), ("first_order", fo)):
                    cell[key].append(float(v))
            scale = max(abs(float(arrays["margin"][e])), MIN_MARGIN)
            dla_total += float(np.abs(c * scale).sum())
            exact_total += float(np.abs(exact).sum())
    if not by_head:
        raise UserError("no P2C event with exact patches: nothing to compare the proxy with")
    heads = sorted(by_head)
    mean = {key: np.asarray([np.mean(by_head[h][key]) for h in heads]) for key in ("exact", "c", "mc", "first_order")}

    def pooled(key: str) -> float:
        return float(stats.spearmanr(mean[key], mean["exact"]).statistic)

    return {
        "events": n_events, "events_without_correlation": undefined, "heads": len(heads),
        "per_event_median": {k: (float(np.median(v)) if v else None) for k, v in per_event.items()},
        "pooled_spearman": {"c": pooled("c"), "mc": pooled("mc"), "first_order": pooled("first_order")},
        "magnitude_ratio": dla_total / exact_total if exact_total else None,
        "head_means": {int(h): {k: float(mean[k][i]) for k in mean} for i, h in enumerate(heads)},
    }
