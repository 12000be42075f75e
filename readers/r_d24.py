"""R-D24 (Sec. 4.5, App. M.1, Table 51): uniform attention supervision, no ranking.

The variant `uniform` (params variants.arms.uniform: the attention term at every head of the
supervised layers with equal weights, no interaction term, λ matched so that its extra loss at the first
step equals Mistill's, `mistill.distill.dose`) against Mistill at the same seed, on the same student
(`mistill.evaluate.variants.VariantReadout`):

* own-heads P2C knock-in recovery at the largest and smallest own top-k (the paper's 40 and 8), the
  paired per-note difference against Mistill at the largest (notes higher of all);
* corpus micro-F1, the share of test generations that ran to the token cap, M1 at P2C (the share of the
  teacher's contrastive events at which the student's margin is positive), the M2 region lift of the own
  top read-side heads at P2C; Mistill's beside each as the reader's own keys;
* the λ the run trained with (its config.json, written by the dose match).
"""

from __future__ import annotations

from pathlib import Path

from mistill.errors import UserError
from mistill.evaluate.readout import main_for, value
from mistill.evaluate.variants import VariantReadout

READER = "readers/r_d24.py"


def keys(params: dict) -> list[str]:
    return ["uniform_own_p2c_k40", "uniform_own_p2c_k8", "uniform_vs_mistill_s0_p2c", "uniform_microf1",
            "uniform_lambda", "uniform_cap_rate", "uniform_m1_p2c", "uniform_m2_lift",
            # registry extra_keys
            "uniform_vs_mistill_s0_p2c_interval", "mistill_s0_microf1", "mistill_s0_cap_rate", "mistill_s0_m1_p2c",
            "mistill_s0_m2_lift_p2c"]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    read = VariantReadout("uniform", params)
    cells = {"uniform_own_p2c_k40": read.own_value("variant", "P2C"),
             "uniform_own_p2c_k8": read.own_value("variant", "P2C", read.k_small),
             "uniform_m2_lift": read.lift_value("variant", "P2C"), "mistill_s0_m2_lift_p2c": read.lift_value("mistill", "P2C")}
    v = {key: cell for key, cell in cells.items() if cell is not None}
    v.update(read.paired_values("uniform_vs_mistill_s0_p2c", "uniform minus Mistill", "mistill"))
    for arm, prefix in (("variant", "uniform"), ("mistill", "mistill_s0")):
        path = read.evaluation(arm).path
        v[f"{prefix}_microf1"] = read.f1_value(arm)
        v[f"{prefix}_cap_rate"] = value(read.cap_share(arm), "share of test generations that reached the token cap, "
                                        f"seed {read.seed}", f"{path}/generations.jsonl")
        v[f"{prefix}_m1_p2c"] = value(read.m1(arm, "P2C"), "M1: share of the teacher's P2C events at which the "
                                      f"student's margin is > 0, pooled over the test notes, seed {read.seed}",
                                      f"{path}/m1.json")

    config = read.run_config()
    arm = config.get("arm") or {}
    if arm.get("lambda_p1") != arm.get("lambda_p2"):
        raise UserError(f"DT-variant@uniform trained with lambda_p1 {arm.get('lambda_p1')} and lambda_p2 "
                        f"{arm.get('lambda_p2')}; Table 51's uniform arm has one λ")
    v["uniform_lambda"] = value(float(arm["lambda_p1"]), "lambda of P1 and P2 at which the first step's added loss "
                                "equals that of Mistill" if config.get("dose") else "lambda of P1 and P2 from params",
                                str(read.run_config_path))
    return v, sorted(set(read.inputs))


def main() -> int:
    return main_for("R-D24", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
