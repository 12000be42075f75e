"""R-D25 (Secs. 4.1 and 4.5, App. I.1 and M.1, Table 51): Mistill without its 8-token window.

The no-window variant (params distill.variants.arms.nowindow: the P1 term supervises the chapter
events alone) against Mistill at the same seed and against fp32 Vanilla CoT-KD, on the same student:

* own-heads knock-in recovery at P1 and P2C (median over test notes of the per-note mean recovery of
  the arm's own top-k, k the largest of evaluate.own_heads.bins, the paper's 40), for the variant and
  for Mistill at the variant's seed;
* the paired per-note difference at P2C, no window minus Mistill (note-clustered mean; the statistic
  carries the sign and Wilcoxon p-values and the notes lower), and the contrastive gain over Vanilla
  CoT-KD at the smallest k (the paper's 8; notes higher of all);
* the M2 region lift of the own top read-side heads at P1, against Mistill's;
* the variant's corpus micro-F1 on the test notes, against Mistill's.

The variant's run, evaluation and own heads live under distill.variants.dir; the main arms' under the
artifacts root (arm labels params evaluate.own_heads.arms).
"""

from __future__ import annotations

from pathlib import Path

from mistill.distill.runs import variant, variant_label
from mistill.errors import UserError
from mistill.evaluate.compare import arm_values, clustered, seed_dirs, seed_medians
from mistill.evaluate.own_heads import OwnHeadsConfig
from mistill.evaluate.readout import arm_labels, eval_root, load_arm, main_for, value
from mistill.stats import StatsParams

READER = "readers/r_d25.py"
VARIANT = "nowindow"
FAMILY = {"qwen": "qwen", "smol": "smollm"}   # params students -> the Table 2/3 row prefixes


def keys(params: dict) -> list[str]:
    return ["nowindow_own_p1_k40", "nowindow_own_p2c_k40", "mistill_s0_own_p1_k40", "mistill_s0_own_p2c_k40",
            "nowindow_microf1", "nowindow_minus_mistill_p2c", "nowindow_vs_vanilla_k8", "nowindow_m2_lift_p1",
            # registry extra_keys
            "mistill_s0_microf1", "mistill_s0_m2_lift_p1", "nowindow_minus_mistill_p2c_interval"]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    distill = params["distill"]
    entry = variant(distill, VARIANT)
    seed = int(entry["seed"])
    label = variant_label(VARIANT, entry)
    family = FAMILY.get(entry["student"])
    labels = arm_labels(params)
    rows = {"mistill": f"{family}_mistill", "vanilla": f"{family}_vanilla_fp32"}
    missing = [row for row in rows.values() if row not in labels]
    if family is None or missing:
        raise UserError(f"params distill.variants.arms.{VARIANT}: student {entry['student']!r} has no "
                        f"{', '.join(missing) or 'Table 3'} row in evaluate.own_heads.arms")
    cfg = OwnHeadsConfig.from_params(params)
    stats = StatsParams.from_params(params)
    k, k_small = max(cfg.bins), min(cfg.bins)
    variants_root, root = Path(distill["variants"]["dir"]), Path(cfg.artifacts)

    def at_seed(values: dict[int, dict[str, float]], where: str) -> dict[int, dict[str, float]]:
        if seed not in values:
            raise UserError(f"{where}-s{seed}: not read; run its own-heads chain")
        return {seed: values[seed]}

    def m4(arm_root: Path, arm: str, phase: str, kk: int) -> dict[int, dict[str, float]]:
        return at_seed(arm_values(arm_root, arm, "m4", phase=phase, k=kk, min_range=cfg.min_range), f"{arm_root}/M6/{arm}")

    def m2(arm_root: Path, arm: str, phase: str) -> dict[int, dict[str, float]]:
        return at_seed(arm_values(arm_root, arm, "m2", phase=phase), f"{arm_root}/M6/{arm}")

    arms = {"nowindow": (variants_root, label), "mistill": (root, labels[rows["mistill"]]),
            "vanilla": (root, labels[rows["vanilla"]])}
    where = {name: f"{r}/M6/{lab}-s{seed}" for name, (r, lab) in arms.items()}
    median_stat = (f"median over test notes of per-note mean recovery (own top-{k}, {{phase}}, 1-nat gate), "
                   f"seed {seed}")
    v: dict = {}
    for name in ("nowindow", "mistill"):
        prefix = "nowindow" if name == "nowindow" else "mistill_s0"
        for phase in ("P1", "P2C"):
            med = seed_medians(m4(*arms[name], phase, k))["per_seed_median"].get(seed)
            if med is not None:
                v[f"{prefix}_own_{phase.lower()}_k40"] = value(med, median_stat.format(phase=phase), where[name])

    c = clustered(m4(*arms["nowindow"], "P2C", k), m4(*arms["mistill"], "P2C", k), stats)
    if c is not None:
        art = f"{where['nowindow']} vs {where['mistill']}"
        v["nowindow_minus_mistill_p2c"] = value(
            c["mean_difference"], f"mean over notes of the per-note difference, no window minus Mistill (own "
            f"top-{k} P2C recovery, seed {seed}); {c['notes_lower']} lower / {c['notes_higher']} higher of "
            f"{c['n_notes']}, sign p {c['sign_p']:.3g}, Wilcoxon p {c['wilcoxon_p']:.3g}", art)
        v["nowindow_minus_mistill_p2c_interval"] = value(
            [c["ci_low"], c["ci_high"]], f"{c['confidence']:.0%} note-bootstrap interval of that mean difference "
            f"({stats.bootstrap_resamples} resamples, seed {stats.bootstrap_seed})", art)
    c = clustered(m4(*arms["nowindow"], "P2C", k_small), m4(*arms["vanilla"], "P2C", k_small), stats)
    if c is not None:
        v["nowindow_vs_vanilla_k8"] = value(
            c["mean_difference"], f"mean over notes of the per-note difference, no window minus fp32 Vanilla CoT-KD "
            f"(own top-{k_small} P2C recovery, seed {seed}); {c['notes_higher']} higher of {c['n_notes']}",
            f"{where['nowindow']} vs {where['vanilla']}")

    for name, key in (("nowindow", "nowindow_m2_lift_p1"), ("mistill", "mistill_s0_m2_lift_p1")):
        lift = seed_medians(m2(*arms[name], "P1"))["per_seed_median"].get(seed)
        if lift is not None:
            v[key] = value(lift, f"M2 region lift of the own top-{cfg.readside_k} read-side heads at P1, median over "
                           f"test notes, seed {seed}", f"{where[name]}/readside.json")

    inputs = [seed_dirs(r, lab)[seed] for r, lab in arms.values()]
    for name, key, evals, arm_label in (("nowindow", "nowindow_microf1", variants_root / "DT-eval", label),
                                        ("mistill", "mistill_s0_microf1", eval_root(params),
                                         labels[rows["mistill"]])):
        run = load_arm(evals, arm_label).get(seed)
        if run is None:
            raise UserError(f"{evals}/{arm_label}-s{seed}: not evaluated; run its evaluation stage")
        v[key] = value(float(run.task["micro_f1"]), f"corpus micro-F1 on the test notes, seed {seed}",
                       f"{run.path}/task.json")
        inputs += run.files()
    return v, inputs


def main() -> int:
    return main_for("R-D25", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
