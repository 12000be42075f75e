"""R-D31 (Sec. 4.5, App. M.2, Table 52): Mistill against a frozen random pool under one λ selection.

Both families (`mistill.evaluate.matched`) pick their λ by the same validation rule on their own grid, then train
three test seeds at the pick. Read:

* the picks at the locked tie band, and again at params selection.sensitivity_band (the paper's 0.005);
* the validation micro-F1 gap by which the band decided: the nearest cell outside it behind the best;
* own-heads recovery of each run's own top-k at P2C (the largest and smallest k of evaluate.own_heads.bins, the
  paper's 40 and 8) and at P1, and the M2 region lift at P2C: Mistill minus RandHeads, the seed pairs (seed i
  against seed i) averaged within each test note, note-clustered, with the per-pair means and the means of the
  per-seed medians.
"""

from __future__ import annotations

from pathlib import Path

from mistill.distill.selection import nearest_miss, pick
from mistill.evaluate.compare import clustered, seed_medians
from mistill.evaluate.matched import Family, matched_families
from mistill.evaluate.readout import main_for, value
from mistill.evaluate.variants import across

READER = "readers/r_d31.py"


def keys(params: dict) -> list[str]:
    return ["mistill_pick_lambda", "randheads_pool0_pick_lambda", "picks_at_0005_band",
            "own_p2c_k40_mistill_minus_randheads", "own_p2c_k8_mistill_minus_randheads",
            "m2_lift_mistill_minus_randheads", "mean_seed_medians_mistill_vs_randheads", "own_p2c_k40_higher_notes",
            "own_p2c_k40_pairs", "p1_recovery_diff", "val_gap_mistill_01_behind_003", "val_gap_randheads_003_behind_03",
            # registry extra_keys
            "own_p2c_k40_mistill_minus_randheads_interval", "own_p2c_k8_mistill_minus_randheads_interval",
            "m2_lift_mistill_minus_randheads_interval", "val_lambdas_mistill", "val_lambdas_randheads",
            "val_microf1_cells_mistill", "val_microf1_cells_randheads"]


def _gap(family: Family) -> tuple[float, str]:
    band = float(family.entry["band"])
    best, miss = pick(family.cells, band), nearest_miss(family.cells, band)
    top = max(c.micro_f1 for c in family.cells)
    if miss is None:
        return 0.0, f"the {family.name} grid: every cell within the band {band:g} of the best; no gap"
    return top - miss.micro_f1, (f"validation micro-F1 gap of the {family.name} grid's nearest cell outside the band "
                                 f"{band:g} (lambda = {miss.lam:g}) behind the best cell; the pick is lambda = "
                                 f"{best.lam:g}")


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    mistill, randheads = matched_families(params)
    first = next(iter(mistill.runs.values()))
    k, k8, stats = first.k, first.k_small, first.stats
    sensitivity = float(params["selection"]["sensitivity_band"])
    seeds = ", ".join(map(str, mistill.seeds))
    art = f"{mistill.where()} vs {randheads.where()}"
    v: dict[str, dict] = {}
    for family, key in ((mistill, "mistill_pick_lambda"), (randheads, "randheads_pool0_pick_lambda")):
        v[key] = value(family.lam, f"lambda_P1 = lambda_P2 picked on the {family.name} grid (lambdas "
                       f"{[c.lam for c in family.cells]}, tie band {family.entry['band']:g}, M1 at P2C among the tied)",
                       family.pick_file)
        v[f"val_lambdas_{family.name}"] = value(sorted(c.lam for c in family.cells), f"the {family.name} grid's cells, "
                                                f"the outward step included", family.pick_file)
        v[f"val_microf1_cells_{family.name}"] = value(
            [c.micro_f1 for c in sorted(family.cells, key=lambda c: c.lam)], f"validation micro-F1 of the "
            f"{family.name} grid's cells in the order of lambda {sorted(c.lam for c in family.cells)}", family.pick_file)
    v["picks_at_0005_band"] = value([pick(f.cells, sensitivity).lam for f in (mistill, randheads)],
                                    f"the picks (Mistill, RandHeads) of the same cells at the tie band {sensitivity:g}",
                                    f"{mistill.pick_file}, {randheads.pick_file}")
    for family, key in ((mistill, "val_gap_mistill_01_behind_003"), (randheads, "val_gap_randheads_003_behind_03")):
        gap, what = _gap(family)
        v[key] = value(gap, what, family.pick_file)

    readouts = {"own_p2c_k40": (f"own top-{k} P2C recovery", "P2C", k),
                "own_p2c_k8": (f"own top-{k8} P2C recovery", "P2C", k8),
                "m2_lift": ("M2 region lift at P2C", "P2C", None),
                "p1_recovery": (f"own top-{k} P1 recovery", "P1", k)}
    for name, (what, phase, kk) in readouts.items():
        arm = mistill.recovery(phase, kk) if kk else mistill.lift(phase)
        ref = randheads.recovery(phase, kk) if kk else randheads.lift(phase)
        c = clustered(arm, ref, stats)
        key = "p1_recovery_diff" if name == "p1_recovery" else f"{name}_mistill_minus_randheads"
        v[key] = value(c["mean_difference"], f"mean over notes of the per-note difference, Mistill at its pick minus "
                       f"RandHeads at its pick ({what}), seed pairs {seeds} averaged within each note; "
                       f"{c['notes_higher']} higher / {c['notes_lower']} lower of {c['n_notes']}, sign p "
                       f"{c['sign_p']:.3g}, Wilcoxon p {c['wilcoxon_p']:.3g}", art)
        if name != "p1_recovery":
            v[f"{key}_interval"] = value([c["ci_low"], c["ci_high"]], f"{c['confidence']:.0%} note-bootstrap interval "
                                         f"of that mean ({stats.bootstrap_resamples} resamples, seed "
                                         f"{stats.bootstrap_seed})", art)
        if name == "own_p2c_k40":
            v["own_p2c_k40_higher_notes"] = value(c["notes_higher"], f"test notes where Mistill's {what} is higher "
                                                  f"(seed pairs averaged), of {c['n_notes']}", art)
            v["own_p2c_k40_pairs"] = value(
                [across(arm[s], ref[s], stats)["mean_difference"] for s in mistill.seeds],
                f"mean over notes of the per-note difference, Mistill minus RandHeads ({what}), per seed pair {seeds}",
                art)
            v["mean_seed_medians_mistill_vs_randheads"] = value(
                [seed_medians(x)["mean_of_seed_medians"] for x in (arm, ref)],
                f"mean over seeds {seeds} of the median over test notes ({what}), Mistill and RandHeads", art)
    return v, sorted(set(mistill.inputs + randheads.inputs))


def main() -> int:
    return main_for("R-D31", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
