"""R-D25 (Secs. 4.1 and 4.5, App. I.1 and M.1, Table 51): Mistill without its 8-token window.

The no-window variant (params distill.variants.arms.nowindow: the P1 term supervises the chapter
events alone) against Mistill at the same seed and against fp32 Vanilla CoT-KD, on the same student
(`mistill.evaluate.variants.VariantReadout`):

* own-heads knock-in recovery at P1 and P2C (median over test notes of the per-note mean recovery of
  the arm's own top-k, k the largest of evaluate.own_heads.bins, the paper's 40), for the variant and
  for Mistill at the variant's seed;
* the paired per-note difference at P2C, no window minus Mistill (note-clustered mean; the statistic
  carries the sign and Wilcoxon p-values and the notes lower), and the contrastive gain over Vanilla
  CoT-KD at the smallest k (the paper's 8; notes higher of all);
* the M2 region lift of the own top read-side heads at P1, against Mistill's;
* the variant's corpus micro-F1 on the test notes, against Mistill's.
"""

from __future__ import annotations

from pathlib import Path

from mistill.evaluate.readout import main_for, value
from mistill.evaluate.variants import VariantReadout

READER = "readers/r_d25.py"


def keys(params: dict) -> list[str]:
    return ["nowindow_own_p1_k40", "nowindow_own_p2c_k40", "mistill_s0_own_p1_k40", "mistill_s0_own_p2c_k40",
            "nowindow_microf1", "nowindow_minus_mistill_p2c", "nowindow_vs_vanilla_k8", "nowindow_m2_lift_p1",
            # registry extra_keys
            "mistill_s0_microf1", "mistill_s0_m2_lift_p1", "nowindow_minus_mistill_p2c_interval"]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    read = VariantReadout("nowindow", params)
    seed, k = read.seed, read.k
    v: dict = {}
    for arm, prefix in (("variant", "nowindow"), ("mistill", "mistill_s0")):
        for phase in ("P1", "P2C"):
            med = read.own_median(arm, phase)
            if med is not None:
                v[f"{prefix}_own_{phase.lower()}_k40"] = value(
                    med, f"median over test notes of per-note mean recovery (own top-{k}, {phase}, 1-nat gate), "
                    f"seed {seed}", read.where(arm))

    c = read.versus("variant", "mistill", "P2C")
    if c is not None:
        art = f"{read.where('variant')} vs {read.where('mistill')}"
        v["nowindow_minus_mistill_p2c"] = value(
            c["mean_difference"], f"mean over notes of the per-note difference, no window minus Mistill (own "
            f"top-{k} P2C recovery, seed {seed}); {c['notes_lower']} lower / {c['notes_higher']} higher of "
            f"{c['n_notes']}, sign p {c['sign_p']:.3g}, Wilcoxon p {c['wilcoxon_p']:.3g}", art)
        v["nowindow_minus_mistill_p2c_interval"] = value(
            [c["ci_low"], c["ci_high"]], f"{c['confidence']:.0%} note-bootstrap interval of that mean difference "
            f"({read.stats.bootstrap_resamples} resamples, seed {read.stats.bootstrap_seed})", art)
    c = read.versus("variant", "vanilla", "P2C", read.k_small)
    if c is not None:
        v["nowindow_vs_vanilla_k8"] = value(
            c["mean_difference"], f"mean over notes of the per-note difference, no window minus fp32 Vanilla CoT-KD "
            f"(own top-{read.k_small} P2C recovery, seed {seed}); {c['notes_higher']} higher of {c['n_notes']}",
            f"{read.where('variant')} vs {read.where('vanilla')}")

    for arm, key in (("variant", "nowindow_m2_lift_p1"), ("mistill", "mistill_s0_m2_lift_p1")):
        lift = read.m2_lift(arm, "P1")
        if lift is not None:
            v[key] = value(lift, f"M2 region lift of the own top-{read.cfg.readside_k} read-side heads at P1, median "
                           f"over test notes, seed {seed}", f"{read.where(arm)}/readside.json")
    for arm, key in (("variant", "nowindow_microf1"), ("mistill", "mistill_s0_microf1")):
        v[key] = value(read.micro_f1(arm), f"corpus micro-F1 on the test notes, seed {seed}",
                       f"{read.evaluation(arm).path}/task.json")
    return v, sorted(set(read.inputs))


def main() -> int:
    return main_for("R-D25", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
