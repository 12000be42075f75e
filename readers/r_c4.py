"""R-C4 (Tables 11-13): the phase structure of the calibrated rankings, BH counts, pooled weights,
recurrence and sparsity.  Head names are model-specific; generic keys describe the leaders."""

from __future__ import annotations

import numpy as np

from mistill.instrument.global_sets import phase_scores
from mistill.instrument.readout import active_params, emit, instrument_dir, load_json, reader_args, value
from mistill.stats import pooled_weights

NAMES = {"P1": "chapter", "P2": "character", "P2C": "contrastive"}


def main() -> int:
    args = reader_args(__doc__.splitlines()[0])
    params = active_params(args.profile)
    out = instrument_dir(params)
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
    if {"P1", "P2", "P2C"} <= set(sets["phases"]):
        leaders = [sets["phases"][p][0] for p in ("P1", "P2", "P2C")]
        v["top_head_shared_by_every_phase"] = value(int(len({(r["layer"], r["head"]) for r in leaders}) == 1),
                                                    "1 if one head ranks first in every phase", ha)
        lead = sets["phases"]["P2C"][0]
        rank_p1 = 1 + next(i for i, r in enumerate(sets["phases"]["P1"])
                           if (r["layer"], r["head"]) == (lead["layer"], lead["head"]))
        v["p2c_leader_rank_p1"] = value(rank_p1, f"rank of {n_layers * n_heads}", ha)
    for pair, stats in cal.get("phase_pairs", {}).items():
        a, b = (NAMES[x] for x in pair.split("-"))
        v[f"ic_corr_{a}_{b}"] = value(stats["pearson"], "Pearson over heads", ca)
        v[f"top{stats['top_k']}_shared_{a}_{b}"] = value(stats["top_k_shared"], f"count of {stats['top_k']}", ca)
    phases = cal.get("phases", {})
    if all(p in phases and "bh_positive" in phases[p] for p in ("P1", "P2", "P2C")):
        v["bh_heads_ic_positive_p1_p2_p2c"] = value([phases[p]["bh_positive"] for p in ("P1", "P2", "P2C")],
                                                    "counts (BH FDR)", ca)
        v["bh_heads_ic_negative_p1_p2_p2c"] = value([phases[p]["bh_negative"] for p in ("P1", "P2", "P2C")],
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
    if "P1" in scores:
        top = np.argsort(-scores["P1"], kind="stable")[:k]
        layers = top // n_heads
        quarters = np.array_split(np.arange(n_layers), 4)
        v[f"chapter_top{k}_heads_per_layer_quarter"] = value(
            [int(np.isin(layers, q).sum()) for q in quarters], "counts in layer quarters, first to last", ha)
    emit("R-C4", v, reader="readers/r_c4.py", inputs=[ha, ca] + ([fa] if fa.exists() else []), params=params,
         strict=args.strict)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
