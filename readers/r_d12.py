"""R-D12 (Secs. 4.4-4.5, Table 3, App. M.1): how the own-heads contrastive recovery varies with the training seed.

Own-heads knock-in recovery at P2C of each arm's own top-k (the largest of evaluate.own_heads.bins, the paper's 40),
from the own-heads chain of every training seed (M6-<arm>-s<seed>):

* per-seed medians over test notes for Qwen Mistill and both Vanilla CoT-KD precisions, and their ranges;
* SmolLM3's Mistill and fp32 Vanilla CoT-KD as means over notes at the first two seeds (its third: R-D27);
* seed-to-seed per-note differences (note-clustered means with sign and Wilcoxon tests): Mistill seed 1 minus 0,
  fp32 Vanilla seed 2 minus 1, and the controls read at two seeds, each with its own random pool: RandHeads
  (variants randheads1 minus randheads, at P2C and P2, with their micro-F1) and SmolLM3's bottom pool
  (smolbottom1 minus smolbottom).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.evaluate.compare import arm_values, seed_dirs, seed_medians
from mistill.evaluate.own_heads import OwnHeadsConfig
from mistill.evaluate.readout import arm_labels, main_for, training_seeds, value
from mistill.evaluate.variants import VariantReadout, across
from mistill.stats import StatsParams

READER = "readers/r_d12.py"


def keys(params: dict) -> list[str]:
    return ["qwen_mistill_own_p2c_seeds", "qwen_fp32_vanilla_own_p2c_seeds", "smollm_mistill_own_p2c_means",
            "smollm_fp32_vanilla_own_p2c_means", "qwen_randheads_seed1_minus_seed0_p2c",
            "smollm_bottom40_seed1_minus_seed0_p2c", "qwen_bf16_vanilla_seed_spread_p2c", "qwen_mistill_seed_spread_p2c",
            "qwen_randheads_seed_diff_lower_notes", "qwen_randheads_seed_diff_p2", "qwen_randheads_seed_task",
            "qwen_mistill_seed1_minus_seed0", "qwen_fp32_vanilla_seed_spread_p2c", "qwen_bf16_vanilla_own_p2c_seeds",
            "qwen_fp32_vanilla_seed2_minus_seed1_p2c", "smollm_bottom40_seed_diff_lower_notes",
            "smollm_mistill_seed_diff_p"]


class SeedReadout:
    """The own-heads P2C recovery of the Table 3 rows at every training seed."""

    def __init__(self, params: dict):
        self.cfg = OwnHeadsConfig.from_params(params)
        self.stats = StatsParams.from_params(params)
        self.labels = arm_labels(params)
        self.root = Path(self.cfg.artifacts)
        self.k = max(self.cfg.bins)
        self.seeds = training_seeds(params)
        if len(self.seeds) < 3:
            raise UserError(f"params distill.seeds {self.seeds}: the seed readout needs three training seeds")
        self.inputs: list[Path] = []

    def recovery(self, row: str, seeds=None, phase: str = "P2C") -> dict[int, dict[str, float]]:
        """{seed: {note: recovery}} of the row, which must hold `seeds` (default: every training seed)."""
        label = self.labels[row]
        values = arm_values(self.root, label, "m4", phase=phase, k=self.k, min_range=self.cfg.min_range)
        missing = [s for s in (self.seeds if seeds is None else seeds) if not values.get(s)]
        if missing:
            raise UserError(f"{self.root}/M6/{label}-s{missing[0]}: not read; run its own-heads chain")
        self.inputs += list(seed_dirs(self.root, label).values())
        return values

    def where(self, row: str, seeds) -> str:
        return ", ".join(f"{self.root}/M6/{self.labels[row]}-s{s}" for s in seeds)

    def medians(self, row: str) -> list[float]:
        per_seed = seed_medians(self.recovery(row))["per_seed_median"]
        return [per_seed[s] for s in self.seeds]

    def means(self, row: str, seeds) -> list[float]:
        values = self.recovery(row, seeds)
        return [float(np.mean(list(values[s].values()))) for s in seeds]

    def between(self, row: str, later: int, earlier: int) -> dict:
        values = self.recovery(row, (later, earlier))
        c = across(values[later], values[earlier], self.stats)
        if c is None:
            raise UserError(f"{self.where(row, (later, earlier))}: no test note read at both seeds")
        return c


def difference_text(c: dict, what: str) -> str:
    return (f"mean over notes of the per-note difference, {what}; {c['notes_higher']} higher / {c['notes_lower']} "
            f"lower of {c['n_notes']}, sign p {c['sign_p']:.3g}, Wilcoxon p {c['wilcoxon_p']:.3g}")


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    read = SeedReadout(params)
    s0, s1, s2 = read.seeds[:3]
    k, seeds_text = read.k, "/".join(map(str, read.seeds))
    v: dict[str, dict] = {}
    for key, row in (("qwen_mistill_own_p2c_seeds", "qwen_mistill"), ("qwen_fp32_vanilla_own_p2c_seeds", "qwen_vanilla_fp32"),
                     ("qwen_bf16_vanilla_own_p2c_seeds", "qwen_vanilla_bf16")):
        medians = read.medians(row)
        v[key] = value(medians, f"medians over test notes of per-note mean recovery (own top-{k}, P2C, 1-nat gate), "
                       f"seeds {seeds_text}", read.where(row, read.seeds))
        spread = key.replace("own_p2c_seeds", "seed_spread_p2c")
        v[spread] = value(max(medians) - min(medians), f"range of those seed medians, seeds {seeds_text}",
                          read.where(row, read.seeds))
    for key, row in (("smollm_mistill_own_p2c_means", "smollm_mistill"),
                     ("smollm_fp32_vanilla_own_p2c_means", "smollm_vanilla_fp32")):
        v[key] = value(read.means(row, (s0, s1)), f"means over test notes of per-note mean recovery (own top-{k}, "
                       f"P2C, 1-nat gate), seeds {s0}/{s1}", read.where(row, (s0, s1)))

    c = read.between("qwen_mistill", s1, s0)
    v["qwen_mistill_seed1_minus_seed0"] = value(c["mean_difference"], difference_text(
        c, f"Mistill seed {s1} minus seed {s0} (own top-{k} P2C recovery)"), read.where("qwen_mistill", (s1, s0)))
    c = read.between("qwen_vanilla_fp32", s2, s1)
    v["qwen_fp32_vanilla_seed2_minus_seed1_p2c"] = value(c["mean_difference"], difference_text(
        c, f"fp32 Vanilla CoT-KD seed {s2} minus seed {s1} (own top-{k} P2C recovery)"),
        read.where("qwen_vanilla_fp32", (s2, s1)))
    c = read.between("smollm_mistill", s1, s0)
    v["smollm_mistill_seed_diff_p"] = value(c["sign_p"], f"sign-test p of SmolLM3 Mistill seed {s1} minus seed {s0} "
                                            f"per note (own top-{k} P2C recovery); {c['notes_higher']} higher / "
                                            f"{c['notes_lower']} lower of {c['n_notes']}",
                                            read.where("smollm_mistill", (s1, s0)))

    for prefix, later, earlier in (("qwen_randheads", "randheads1", "randheads"),
                                   ("smollm_bottom40", "smolbottom1", "smolbottom")):
        first, second = VariantReadout(later, params), VariantReadout(earlier, params)
        art = f"{first.where('variant')} vs {second.where('variant')}"
        what = f"{later} (seed {first.seed}) minus {earlier} (seed {second.seed}), each its own pool"
        c = across(first.notes_of("variant", "P2C"), second.notes_of("variant", "P2C"), read.stats)
        v[f"{prefix}_seed1_minus_seed0_p2c"] = value(c["mean_difference"], difference_text(
            c, f"{what} (own top-{k} P2C recovery)"), art)
        v[f"{prefix}_seed_diff_lower_notes"] = value(c["notes_lower"], f"notes lower, {what} (own top-{k} P2C "
                                                     f"recovery), of {c['n_notes']}", art)
        read.inputs += first.inputs + second.inputs
        if prefix == "qwen_randheads":
            c = across(first.notes_of("variant", "P2"), second.notes_of("variant", "P2"), read.stats)
            v["qwen_randheads_seed_diff_p2"] = value(c["mean_difference"], difference_text(
                c, f"{what} (own top-{k} P2 recovery)"), art)
            v["qwen_randheads_seed_task"] = value(
                [second.micro_f1("variant"), first.micro_f1("variant")], f"corpus micro-F1 on the test notes, "
                f"{earlier} (seed {second.seed}) and {later} (seed {first.seed})",
                f"{second.evaluation('variant').path}/task.json, {first.evaluation('variant').path}/task.json")
            read.inputs += [second.evaluation("variant").path / "task.json", first.evaluation("variant").path / "task.json"]
    return v, sorted(set(read.inputs))


def main() -> int:
    return main_for("R-D12", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
