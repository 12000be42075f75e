"""R-D25 (Secs. 4.1 and 4.5, App. I.1 and M.1, Table 51): Mistill without its 8-token window.

The no-window variant (params variants.arms.nowindow: the P1 term supervises the chapter
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

from mistill.evaluate.readout import main_for
from mistill.evaluate.variants import VariantReadout

READER = "readers/r_d25.py"


def keys(params: dict) -> list[str]:
    return ["nowindow_own_p1_k40", "nowindow_own_p2c_k40", "mistill_s0_own_p1_k40", "mistill_s0_own_p2c_k40",
            "nowindow_microf1", "nowindow_minus_mistill_p2c", "nowindow_vs_vanilla_k8", "nowindow_m2_lift_p1",
            # registry extra_keys
            "mistill_s0_microf1", "mistill_s0_m2_lift_p1", "nowindow_minus_mistill_p2c_interval"]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    read = VariantReadout("nowindow", params)
    cells = {f"{prefix}_own_{phase.lower()}_k40": read.own_value(arm, phase)
             for arm, prefix in (("variant", "nowindow"), ("mistill", "mistill_s0")) for phase in ("P1", "P2C")}
    cells.update({"nowindow_m2_lift_p1": read.lift_value("variant", "P1"),
                  "mistill_s0_m2_lift_p1": read.lift_value("mistill", "P1"),
                  "nowindow_microf1": read.f1_value("variant"), "mistill_s0_microf1": read.f1_value("mistill")})
    v = {key: cell for key, cell in cells.items() if cell is not None}
    v.update(read.paired_values("nowindow_minus_mistill_p2c", "no window minus Mistill", "mistill"))
    v.update(read.paired_values("nowindow_vs_vanilla_k8", "no window minus fp32 Vanilla CoT-KD", "vanilla",
                                k=read.k_small, interval=False))
    return v, sorted(set(read.inputs))


def main() -> int:
    return main_for("R-D25", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
