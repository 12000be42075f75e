"""R-C4 (Tables 11-13): the phase structure of the calibrated rankings, BH counts, pooled weights,
recurrence and sparsity.

Generic keys describe the leaders (`top_head_ic_p1`); keys that name a head (`l39h38_ic_p1`,
`l30h11_rank_p2c`, `recurrence_counts_l39h38_...`) name the heads of params `readers.named_heads`,
so the paper profile writes the paper's heads and the demo its own.  The pool size k is
`instrument.calibration.pool_k` (the paper's top-40), the recurrence top-k
`instrument.calibration.recurrence_top_k` (its top-20), the layer ranges `readers.layer_ranges`
and `readers.importance_share_layers`.  The teacher's shortlist run (HD-002, params
`distill.teacher_head_sets`) gives its pool leaders' weights when it has been built.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.instrument.global_sets import phase_scores
from mistill.instrument.readout import (
    PHASES,
    head_index,
    instrument_dir,
    layers_name,
    load_json,
    reader_settings,
    run_reader,
    value,
)
from mistill.stats import pooled_weights

READER = "readers/r_c4.py"
NAMES = {"P1": "chapter", "P2": "character", "P2C": "contrastive"}
PAIRS = ("P1-P2", "P1-P2C", "P2-P2C")


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params`."""
    calibration = params["instrument"]["calibration"]
    k, rk = calibration["pool_k"], calibration["recurrence_top_k"]
    settings = reader_settings(params)
    heads = settings.named_heads
    out = ["top_head_shared_by_every_phase", "p2c_leader_rank_p1", f"top{k}_shared_ch_char_ch_con_char_con",
           "bh_heads_ic_positive_p1_p2_p2c", "bh_heads_ic_negative_p1_p2_p2c", "bh_heads_ic_negative_p1",
           f"recurrent_heads_top{rk}", "chapter_heads_above_floor", "chapter_heads_carrying_80pct",
           "per_note_heads_carrying_80pct", "ic_null_floor", "exact_refinement_nominated_heads",
           f"exact_merged_vs_firstorder_top{k}_overlap", "exact_merged_bh_positive_heads",
           "p2c_firstorder_vs_exact_per_event_corr", f"chapter_top{k}_heads_per_layer_quarter",
           "hd002_pool_leader_weights_p1_p2_p2c"]
    for p in (p.lower() for p in PHASES):
        out += [f"top_head_ic_{p}", f"top_head_weight_top{k}_{p}", f"pooled_weight_leader_k3_{p}"]
    for pair in PAIRS:
        a, b = (NAMES[x] for x in pair.split("-"))
        out += [f"ic_corr_{a}_{b}", f"top{k}_shared_{a}_{b}"]
    out += [f"chapter_top{k}_heads_in_layers_{layers_name(r)}" for r in settings.layer_ranges]
    out += [f"chapter_top{k}_importance_share_layers_{layers_name(r)}" for r in settings.importance_share_layers]
    if heads.leader:
        out += [f"{heads.leader}_ic_{p.lower()}" for p in PHASES] + [f"{heads.leader}_weight_top{k}_p1_p2_p2c"]
    if heads.contrastive_specialist:
        out += [f"{heads.contrastive_specialist}_rank_p1", f"{heads.contrastive_specialist}_rank_p2c"]
    if heads.recurrent:
        out.append("recurrence_counts_" + "_".join(heads.recurrent))
    return out


def _rank(ranked: list[dict], n_heads: int, index: int) -> int:
    """1-based rank of the head with flat index `index` in a phase's ranked list."""
    return 1 + next(i for i, r in enumerate(ranked) if r["layer"] * n_heads + r["head"] == index)


def compute_values(params: dict) -> tuple[dict, list]:
    out = instrument_dir(params)
    settings = reader_settings(params)
    ha, ca = out / "head_sets_contrast.json", out / "calibration.json"
    sets, cal = load_json(ha), load_json(ca)
    n_layers, n_heads = sets["n_layers"], sets["n_heads"]
    k = sets["pool_k"]
    scores = {p: phase_scores(sets, p) for p in sets["phases"]}
    v: dict = {}
    for phase, ranked in sets["phases"].items():
        p = phase.lower()
        v[f"top_head_ic_{p}"] = value(ranked[0]["ic"], "nats, mean I_c over notes of the rank-1 head", ha)
        v[f"top_head_weight_top{k}_{p}"] = value(ranked[0]["weight"], f"softmax weight in the top-{k} pool", ha)
        if len(ranked) >= 3:
            v[f"pooled_weight_leader_k3_{p}"] = value(float(pooled_weights(scores[phase], 3).weights[0]),
                                                      "softmax weight of the leader at k=3", ha)
    all_phases = set(PHASES) <= set(sets["phases"])
    if all_phases:
        leaders = [sets["phases"][p][0] for p in PHASES]
        v["top_head_shared_by_every_phase"] = value(int(len({(r["layer"], r["head"]) for r in leaders}) == 1),
                                                    "1 if one head ranks first in every phase", ha)
        lead = sets["phases"]["P2C"][0]
        v["p2c_leader_rank_p1"] = value(_rank(sets["phases"]["P1"], n_heads, lead["layer"] * n_heads + lead["head"]),
                                        f"rank of {n_layers * n_heads}", ha)
    v.update(_named_head_values(sets, settings.named_heads, ha, ca, cal))
    pairs = cal.get("phase_pairs", {})
    for pair, stats in pairs.items():
        a, b = (NAMES[x] for x in pair.split("-"))
        v[f"ic_corr_{a}_{b}"] = value(stats["pearson"], "Pearson over heads", ca)
        v[f"top{stats['top_k']}_shared_{a}_{b}"] = value(stats["top_k_shared"], f"count of {stats['top_k']}", ca)
    if set(PAIRS) <= set(pairs):
        tk = pairs["P1-P2"]["top_k"]
        v[f"top{tk}_shared_ch_char_ch_con_char_con"] = value(
            [pairs[p]["top_k_shared"] for p in PAIRS], f"counts of {tk} shared: chapter-character, "
            "chapter-contrastive, character-contrastive", ca)
    phases = cal.get("phases", {})
    if all(p in phases and "bh_positive" in phases[p] for p in PHASES):
        v["bh_heads_ic_positive_p1_p2_p2c"] = value([phases[p]["bh_positive"] for p in PHASES],
                                                    "counts (BH FDR)", ca)
        v["bh_heads_ic_negative_p1_p2_p2c"] = value([phases[p]["bh_negative"] for p in PHASES],
                                                    "counts (BH FDR)", ca)
    if "P1" in phases and "bh_negative" in phases["P1"]:
        v["bh_heads_ic_negative_p1"] = value(phases["P1"]["bh_negative"], "count (BH FDR)", ca)
    if "recurrence" in cal:
        rk = cal["recurrence"]["top_k"]
        v[f"recurrent_heads_top{rk}"] = value(cal["recurrence"]["n_recurrent"], "count (binomial, Bonferroni)", ca)
    for key in ("chapter_heads_above_floor", "chapter_heads_carrying_80pct"):
        if key in cal:
            v[key] = value(cal[key], "count", ca)
    if "per_note_heads_carrying_80pct_median" in cal:
        v["per_note_heads_carrying_80pct"] = value(cal["per_note_heads_carrying_80pct_median"], "median over notes", ca)
    if "ic_floor" in cal:
        v["ic_null_floor"] = value(cal["ic_floor"], "nats, 95th pct |split-half NULL difference|", ca)
    fa = out / "faithfulness2.json"
    refinement = load_json(fa).get("p2c_exact_refinement", {}) if fa.exists() else {}
    if refinement:
        rk = refinement["top_k"]
        v["exact_refinement_nominated_heads"] = value(refinement["nominated_heads_mean"],
                                                      "mean count per P2C event", fa)
        v[f"exact_merged_vs_firstorder_top{rk}_overlap"] = value(refinement["merged_vs_first_order_top_k_overlap"],
                                                                 f"count of {rk}", fa)
        if "merged_bh_positive" in refinement:
            v["exact_merged_bh_positive_heads"] = value(refinement["merged_bh_positive"], "count (BH FDR)", fa)
        if "first_order_vs_exact_per_event_pearson_median" in refinement:
            v["p2c_firstorder_vs_exact_per_event_corr"] = value(
                refinement["first_order_vs_exact_per_event_pearson_median"], "median per-event Pearson", fa)
    outside = [r for r in settings.layer_ranges + settings.importance_share_layers if r[1] >= n_layers]
    if outside:
        raise UserError(f"params.yaml readers: layer range {list(outside[0])} is outside the model's {n_layers} "
                        "layers (the ranges are the profile's model's)")
    if "P1" in scores:
        top = np.argsort(-scores["P1"], kind="stable")[:k]
        layers = top // n_heads
        quarters = np.array_split(np.arange(n_layers), 4)
        v[f"chapter_top{k}_heads_per_layer_quarter"] = value(
            [int(np.isin(layers, q).sum()) for q in quarters], "counts in layer quarters, first to last", ha)
        for first, last in settings.layer_ranges:
            v[f"chapter_top{k}_heads_in_layers_{first}_{last}"] = value(
                int(((layers >= first) & (layers <= last)).sum()), f"count of {k} (layers {first}-{last})", ha)
        importance = scores["P1"][top]
        for first, last in settings.importance_share_layers:
            inside = importance[(layers >= first) & (layers <= last)].sum()
            v[f"chapter_top{k}_importance_share_layers_{first}_{last}"] = value(
                float(100.0 * inside / importance.sum()),
                f"percent of the summed I_c of the chapter top-{k} in layers {first}-{last}", ha)
    inputs: list[Path] = [ha, ca] + ([fa] if fa.exists() else [])
    hd002 = Path((params.get("distill") or {}).get("teacher_head_sets") or "")
    if hd002.is_file():
        teacher = load_json(hd002)
        if all(p in teacher["phases"] for p in PHASES):
            leaders = [teacher["phases"][p][0] for p in PHASES]
            v["hd002_pool_leader_weights_p1_p2_p2c"] = value(
                [r["weight"] for r in leaders], f"softmax weights of the leader of each phase in the teacher's "
                f"top-{teacher['pool_k']} pool on shortlist traces (HD-002)", hd002)
            inputs.append(hd002)
    return v, inputs


def _named_head_values(sets: dict, heads, ha: Path, ca: Path, cal: dict) -> dict:
    """The numbers of the heads params `readers.named_heads` names (the paper's L39H38, L30H11, ...)."""
    n_layers, n_heads, k = sets["n_layers"], sets["n_heads"], sets["pool_k"]
    total = n_layers * n_heads
    v: dict = {}
    rows = {p: {r["layer"] * n_heads + r["head"]: r for r in ranked} for p, ranked in sets["phases"].items()}
    if heads.leader and set(PHASES) <= set(rows):
        i = head_index(heads.leader, n_layers, n_heads)
        for p in PHASES:
            v[f"{heads.leader}_ic_{p.lower()}"] = value(
                rows[p][i]["ic"], f"nats, mean I_c over notes (rank {_rank(sets['phases'][p], n_heads, i)} of "
                f"{total})", ha)
        v[f"{heads.leader}_weight_top{k}_p1_p2_p2c"] = value(
            [rows[p][i]["weight"] or 0.0 for p in PHASES], f"softmax weights in the top-{k} pool per phase "
            "(0 for a head not in the pool)", ha)
    if heads.contrastive_specialist and {"P1", "P2C"} <= set(rows):
        i = head_index(heads.contrastive_specialist, n_layers, n_heads)
        for p in ("P1", "P2C"):
            v[f"{heads.contrastive_specialist}_rank_{p.lower()}"] = value(
                _rank(sets["phases"][p], n_heads, i), f"rank of {total}", ha)
    if heads.recurrent and "recurrence" in cal:
        counts = cal["recurrence"]["counts"]
        v["recurrence_counts_" + "_".join(heads.recurrent)] = value(
            [int(counts[head_index(h, n_layers, n_heads)]) for h in heads.recurrent],
            f"count of notes with the head in the note's top-{cal['recurrence']['top_k']} (of {cal['n_notes']} "
            "notes)", ca)
    return v


def main() -> int:
    return run_reader("R-C4", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
