"""Necessity and knock-in sufficiency of head sets (Sec. 3.1, App. C "Knock-in", App. D).

Necessity (clean run): mean-ablate the set at q,

    necessity = (margin_clean - margin_ablated) / margin_clean          (> 1: the decision flips)

Knock-in (corrupted run = the next note, at a matched event with a different
emitted choice): feed the clean token at q in the donor's context cropped at its
event, overwrite the set's head outputs with the values recorded at q in the
clean run, and read the clean event's margin:

    R = (margin_set - margin_corr) / (margin_all - margin_corr)

margin_corr: nothing knocked in; margin_all: every head knocked in (equals the
clean margin: the same token, position-local MLPs and norms).  An event counts
only if margin_all - margin_corr >= 1 nat (the range gate).  Sets per bin k:
the phase's global top-k by I_c, count-matched random heads (redrawn per note
and bin), the global bottom-k, and the note's own top-k.  Every set variant of
one event is one token of a batched forward against the shared cache, beside other events' variants.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from mistill.errors import UserError
from mistill.instrument.attribution import nominees
from mistill.instrument.events import DECISION_KINDS, Event, note_rng
from mistill.instrument.hook import HeadHook
from mistill.instrument.margin import margin
from mistill.instrument.patching import EventVariants, one_head_mask, prefill, run_variants

SET_KINDS = ("top", "random", "bottom", "own")


def head_set_masks(*, phase: str, note_id: str, bins: Sequence[int], global_scores: np.ndarray,
                   own_scores: np.ndarray | None, n_layers: int, n_heads: int, seed: int
                   ) -> dict[tuple[str, int], torch.Tensor]:
    """(set kind, k) -> [L, H] boolean mask."""
    n = n_layers * n_heads
    order = np.argsort(-global_scores, kind="stable")
    sets: dict[tuple[str, int], np.ndarray] = {}
    for k in bins:
        if k > n:
            continue
        sets[("top", k)] = order[:k]
        sets[("bottom", k)] = order[::-1][:k]
        sets[("random", k)] = note_rng(seed, f"{note_id}:{phase}:random:{k}").choice(n, size=k, replace=False)
        if own_scores is not None:
            sets[("own", k)] = np.argsort(-own_scores, kind="stable")[:k]
    masks = {}
    for key, heads in sets.items():
        mask = torch.zeros(n, dtype=torch.bool)
        # a copy: a one-head slice of the reversed order keeps its negative stride, which torch refuses
        mask[torch.from_numpy(np.array(heads, dtype=np.int64))] = True
        masks[key] = mask.view(n_layers, n_heads)
    return masks


def match_donor_events(clean: Sequence[Event], donor: Sequence[Event], rule: str = "first") -> list[int | None]:
    """For each clean event, the index of its donor event: same kind, a different emitted token.

    rule 'first': the donor's first such event; 'index': the n-th event of the kind (n = the clean
    event's index within its kind), moving forward to the next with a different target.
    """
    by_kind: dict[str, list[int]] = {}
    for i, e in enumerate(donor):
        by_kind.setdefault(e.kind, []).append(i)
    seen: dict[str, int] = {}
    out: list[int | None] = []
    for e in clean:
        candidates = [i for i in by_kind.get(e.kind, []) if donor[i].target_id != e.target_id]
        n = seen.get(e.kind, 0)
        seen[e.kind] = n + 1
        if not candidates:
            out.append(None)
        elif rule == "index":
            out.append(candidates[n % len(candidates)])
        else:
            out.append(candidates[0])
    return out


def faithfulness_note(model, hook: HeadHook, *, note_id: str, clean_ids: Sequence[int],
                      clean_events: Sequence[Event], donor_id: str, donor_ids: Sequence[int],
                      donor_events: Sequence[Event], global_scores: Mapping[str, np.ndarray],
                      own_scores: Mapping[str, np.ndarray | None], bins: Sequence[int], seed: int,
                      max_batch: int = 64, donor_match: str = "first",
                      p2c_first_order: Mapping[int, np.ndarray] | None = None, p2c_nominees_topk: int = 40,
                      p2c_global_top: Sequence[tuple[int, int]] = ()) -> list[dict]:
    """One row per clean decision event: necessity margins in the clean run, knock-in margins in the donor's.

    With `p2c_first_order` (pos -> the attribution pass's I^fo [L, H] at that P2C event), each P2C
    event's nominees (top-k by |A_h| plus the global top) are also mean-ablated one at a time:
    the exact P2C refinement of App. D (Table 13).

    Every variant of every event of one run (clean or donor) is one token of a batched forward
    against that run's cache, at most `max_batch` per forward, several events per forward.
    """
    L, H = hook.n_layers, hook.n_heads
    events = [e for e in clean_events if e.kind in DECISION_KINDS and e.kind in global_scores]
    masks = {phase: head_set_masks(phase=phase, note_id=note_id, bins=bins, global_scores=global_scores[phase],
                                   own_scores=own_scores.get(phase), n_layers=L, n_heads=H, seed=seed)
             for phase in {e.kind for e in events}}
    keys = {phase: list(m) for phase, m in masks.items()}
    nothing, everything = torch.zeros(L, H, dtype=torch.bool), torch.ones(L, H, dtype=torch.bool)
    if not events:
        return []

    # the clean run: per event, nothing ablated (the clean margin; its head outputs are what the
    # knock-in writes), each set mean-ablated, and each P2C nominee mean-ablated alone
    p2c_heads: dict[int, list[tuple[int, int]]] = {}
    if p2c_first_order is not None:
        p2c_heads = {i: nominees(p2c_first_order[e.pos], p2c_nominees_topk, p2c_global_top)
                     for i, e in enumerate(events) if e.kind == "P2C" and e.pos in p2c_first_order}
    clean_sets = {i: [nothing, *(masks[e.kind][k] for k in keys[e.kind]),
                      *(one_head_mask(L, H, h) for h in p2c_heads.get(i, ()))] for i, e in enumerate(events)}
    clean = prefill(model, hook, clean_ids, reserve=max_batch)
    tokens = {i: clean_ids[e.pos - 1] for i, e in enumerate(events)}  # the clean token at each event
    ablations = EventVariants.build({i: e.pos - 1 for i, e in enumerate(events)}, tokens, clean_sets)
    ablations.values = clean.mu
    run = run_variants(model, hook, clean.cache, ablations, max_batch,
                       record_rows=[ablations.spans[i][0] for i in range(len(events))])
    recorded = run.recorded  # [E, L, H, D]: every head's clean output at each event's q
    del clean
    rows: list[dict] = []
    for i, ev in enumerate(events):
        lo, hi = ablations.spans[i]
        m = margin(run.logits[lo:hi], ev.target_id, ev.competitor_ids)
        n_sets = len(keys[ev.kind])
        row = {"kind": ev.kind, "pos": ev.pos, "target_id": ev.target_id, "margin_clean": float(m[0]),
               "necessity": _by_set(keys[ev.kind], m[1:1 + n_sets].tolist()), "donor_note": None, "donor_pos": None}
        if i in p2c_heads:
            first = p2c_first_order[ev.pos]
            row["p2c_exact"] = {"heads": [layer * H + head for layer, head in p2c_heads[i]],
                                "exact": (m[0] - m[1 + n_sets:]).tolist(),
                                "first_order": [float(first[layer, head]) for layer, head in p2c_heads[i]]}
        rows.append(row)

    # the donor's run: the clean token at the matched donor event, nothing / every head / each set
    # knocked in with the clean run's head outputs
    matches = match_donor_events(events, donor_events, donor_match)
    at_donor = {i: donor_events[j].pos - 1 for i, j in enumerate(matches) if j is not None}
    if at_donor:
        donor = prefill(model, hook, donor_ids, reserve=max_batch)
        knock_ins = EventVariants.build(at_donor, tokens,
                                        {i: [nothing, everything, *(masks[events[i].kind][k]
                                                                    for k in keys[events[i].kind])]
                                         for i in at_donor})
        knock_ins.values, knock_ins.value_rows = recorded, knock_ins.event_of
        logits = run_variants(model, hook, donor.cache, knock_ins, max_batch).logits
        for i, q_d in at_donor.items():
            ev = events[i]
            lo, hi = knock_ins.spans[i]
            m = margin(logits[lo:hi], ev.target_id, ev.competitor_ids).tolist()
            rows[i].update(donor_note=donor_id, donor_pos=q_d + 1, margin_corr=m[0], margin_all=m[1],
                           knockin=_by_set(keys[ev.kind], m[2:]))
    return rows


def _by_set(keys: Sequence[tuple[str, int]], values: Sequence[float]) -> dict:
    out: dict[str, dict[str, float]] = {}
    for (kind, k), v in zip(keys, values):
        out.setdefault(kind, {})[str(k)] = float(v)
    return out


# ---- aggregation over notes (Table 1, Table 10, Table 14) -------------------------------------------


def summarize(rows_by_note: Mapping[str, Sequence[dict]], *, bins: Sequence[int], min_range: float = 1.0,
              units: Mapping[str, str] | None = None) -> dict:
    """Medians over notes of per-note means, sign tests against random, gate and validation numbers.

    With `units` (note -> patient), every cell is re-aggregated with the patient as the unit: a patient's
    notes' means are averaged first, then the median and the sign tests run over patients (App. C
    "Patients"; each cell's n_notes then counts patients).
    """
    from mistill.stats import knock_in_recovery, median_of_note_means, necessity, sign_test
    from mistill.stats.effects import note_means

    if units is not None:
        missing = sorted(set(rows_by_note) - set(units))
        if missing:
            raise UserError(f"{len(missing)} notes (e.g. {missing[0]}) have no patient to re-aggregate by")

    out: dict = {"min_range": min_range, "phases": {}}
    for phase in DECISION_KINDS:
        rows = [(note, r) for note, rs in rows_by_note.items() for r in rs if r["kind"] == phase]
        if not rows:
            continue
        entry: dict = {"n_events": len(rows), "n_notes": len({n for n, _ in rows})}
        knocked = [(n, r) for n, r in rows if r.get("margin_all") is not None]
        if knocked:
            all_minus_clean = np.array([r["margin_all"] - r["margin_clean"] for _, r in knocked])
            gap = np.array([r["margin_all"] - r["margin_corr"] for _, r in knocked])
            entry.update(n_knockin_events=len(knocked),
                         all_heads_minus_clean_median=float(np.median(all_minus_clean)),
                         all_heads_minus_clean_max_abs=float(np.abs(all_minus_clean).max()),
                         corrupt_context_gap_median=float(np.median(gap)),
                         range_gate_pass_rate=float((gap >= min_range).mean()))
        per_bin: dict = {}
        for k in bins:
            cell: dict = {}
            for measure in ("necessity", "knockin"):
                note_values: dict[str, dict[str, float]] = {}
                for kind in SET_KINDS:
                    if measure == "necessity":
                        sel = [(n, r) for n, r in rows if str(k) in r["necessity"].get(kind, {})
                               and r["margin_clean"] != 0]
                        if not sel:
                            continue
                        vals = necessity([r["margin_clean"] for _, r in sel],
                                         [r["necessity"][kind][str(k)] for _, r in sel])
                        notes = [n for n, _ in sel]
                    else:
                        sel = [(n, r) for n, r in knocked if str(k) in r["knockin"].get(kind, {})]
                        if not sel:
                            continue
                        rec = knock_in_recovery([r["knockin"][kind][str(k)] for _, r in sel],
                                                [r["margin_corr"] for _, r in sel],
                                                [r["margin_all"] for _, r in sel], min_range=min_range)
                        vals = rec.recovery
                        notes = [n for (n, _), ok in zip(sel, rec.passed) if ok]
                    if len(vals) == 0:
                        continue
                    summary = median_of_note_means(vals, notes)
                    ids, means = summary.note_ids, summary.note_means
                    if units is not None:
                        ids, means = note_means(means, [units[n] for n in ids])
                    note_values[kind] = dict(zip(ids, means.tolist()))
                    cell.setdefault(measure, {})[kind] = {
                        "median": float(np.median(means)), "n_notes": len(ids),
                        "p10": float(np.percentile(means, 10)),
                        "p90": float(np.percentile(means, 90)),
                        "notes_above_half": int((means > 0.5).sum())}
                for other in ("random", "bottom", "own"):
                    if "top" in note_values and other in note_values:
                        shared = sorted(set(note_values["top"]) & set(note_values[other]))
                        if shared:
                            test = sign_test([note_values["top"][n] for n in shared],
                                             [note_values[other][n] for n in shared])
                            cell.setdefault(measure, {}).setdefault("vs", {})[other] = {
                                "notes_top_above": test.n_positive, "notes": test.n, "p_value": test.p_value}
            if cell:
                per_bin[str(k)] = cell
        entry["bins"] = per_bin
        out["phases"][phase] = entry
    return out


def exact_refinement(rows_by_note: Mapping[str, Sequence[dict]],
                     first_order_p2c: Mapping[str, Mapping[int, np.ndarray]], p2c_ic: np.ndarray, *,
                     top_k: int, fdr: float) -> dict:
    """The exact P2C refinement (App. D, Table 13): raw I exact where measured, first-order elsewhere.

    Per note, the mean over its P2C events of the exact-merged importance; then the ranking by the
    mean over notes, its top-k overlap with the first-order I_c ranking (the P2C global set), BH
    discoveries on the per-note values, and the per-event Pearson of first-order and exact effects
    over the nominated heads (median over events).  Raw I: not NULL-calibrated.
    """
    from scipy import stats

    from mistill.stats import head_discoveries, top_k_overlap

    per_note, n_nominated, corr = [], [], []
    for note, rows in rows_by_note.items():
        merged = []
        for r in rows:
            if "p2c_exact" not in r or r["pos"] not in first_order_p2c.get(note, {}):
                continue
            vec = first_order_p2c[note][r["pos"]].reshape(-1).astype(float).copy()
            refined = r["p2c_exact"]
            vec[refined["heads"]] = refined["exact"]
            merged.append(vec)
            n_nominated.append(len(refined["heads"]))
            if len(refined["heads"]) > 2 and np.ptp(refined["exact"]) > 0 and np.ptp(refined["first_order"]) > 0:
                corr.append(stats.pearsonr(refined["first_order"], refined["exact"]).statistic)
        if merged:
            per_note.append(np.mean(merged, axis=0))
    if not per_note:
        return {}
    matrix = np.stack(per_note)
    mean = matrix.mean(0)
    k = min(top_k, mean.size)
    out = {"n_notes": len(per_note), "n_events": len(n_nominated),
           "nominated_heads_mean": float(np.mean(n_nominated)), "top_k": k,
           "merged_vs_first_order_top_k_overlap": top_k_overlap(mean, p2c_ic, k),
           "ranking": np.argsort(-mean, kind="stable").tolist(), "merged_mean": mean.tolist()}
    if corr:
        out["first_order_vs_exact_per_event_pearson_median"] = float(np.median(corr))
    if len(per_note) >= 2:
        out["merged_bh_positive"] = head_discoveries(matrix, fdr).discoveries.n_positive
    return out
