"""R-D7 (Secs. 4.4 and 4.5, Figure 2, App. M.1 and M.3, Tables 50 and 51): the position and head controls.

Recipe variants (params variants.arms) at seed 0:

    randpos, smolrandpos        the student's own top heads supervised at random positions of the teacher's
                                trace (positions: random, `mistill.distill.positions`)
    randheads, smolrandheads    random heads of the top pool's layers at the teacher's events
    randboth                    random heads at random positions (Qwen)

read beside Mistill and the untrained student of the same student (`mistill.evaluate.variants`):

* own-heads knock-in recovery at P2C (and RandHeads at P2): the median over test notes of the per-note mean
  recovery of the arm's own top-k, k the largest of evaluate.own_heads.bins (the paper's 40);
* the paired per-note differences RandBoth minus RandHeads and RandBoth minus RandPos, and each RandPos arm
  minus its untrained student (note-clustered means with sign and Wilcoxon p-values);
* the M2 region lift and the emitted-prefix share of the own top read-side heads at P2C.
"""

from __future__ import annotations

from pathlib import Path

from mistill.evaluate.readout import main_for
from mistill.evaluate.variants import VariantReadout

READER = "readers/r_d7.py"


def keys(params: dict) -> list[str]:
    return ["qwen_randpos_own_p2c", "smollm_randpos_own_p2c", "qwen_randheads_own_p2c", "smollm_randheads_own_p2c",
            "smollm_mistill_s0_own_p2c", "qwen_randboth_own_p2c", "randboth_minus_randheads",
            "randboth_minus_randpos", "qwen_randboth_m2_lift_p2c", "qwen_randboth_prefix_share",
            "smollm_randpos_m2_lift_p2c", "qwen_randheads_own_p2",
            # registry extra_keys
            "qwen_untrained_own_p2c", "smollm_untrained_own_p2c", "qwen_randpos_minus_untrained",
            "qwen_randpos_minus_untrained_interval", "smollm_randpos_minus_untrained",
            "smollm_randpos_minus_untrained_interval", "randboth_minus_randheads_interval",
            "randboth_minus_randpos_interval", "qwen_untrained_prefix_share", "qwen_mistill_m2_lift_p2c",
            "smollm_mistill_m2_lift_p2c"]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    qwen = VariantReadout("randpos", params, others=("randheads", "randboth"))
    smol = VariantReadout("smolrandpos", params, others=("smolrandheads",))
    cells = {"qwen_randpos_own_p2c": qwen.own_value("variant", "P2C"),
             "qwen_randheads_own_p2c": qwen.own_value("randheads", "P2C"),
             "qwen_randheads_own_p2": qwen.own_value("randheads", "P2"),
             "qwen_randboth_own_p2c": qwen.own_value("randboth", "P2C"),
             "qwen_untrained_own_p2c": qwen.own_value("untrained", "P2C"),
             "smollm_randpos_own_p2c": smol.own_value("variant", "P2C"),
             "smollm_randheads_own_p2c": smol.own_value("smolrandheads", "P2C"),
             "smollm_mistill_s0_own_p2c": smol.own_value("mistill", "P2C"),
             "smollm_untrained_own_p2c": smol.own_value("untrained", "P2C"),
             "qwen_randboth_m2_lift_p2c": qwen.lift_value("randboth", "P2C"),
             "qwen_mistill_m2_lift_p2c": qwen.lift_value("mistill", "P2C"),
             "smollm_randpos_m2_lift_p2c": smol.lift_value("variant", "P2C"),
             "smollm_mistill_m2_lift_p2c": smol.lift_value("mistill", "P2C")}
    v = {key: cell for key, cell in cells.items() if cell is not None}
    for key, arm in (("qwen_randboth_prefix_share", "randboth"), ("qwen_untrained_prefix_share", "untrained")):
        share = qwen.prefix_share(arm)
        if share is not None:
            v[key] = {"value": share, "statistic": f"emitted-prefix share of attention of the own top-"
                      f"{qwen.cfg.readside_k} read-side heads at P2C, seed {qwen.seed}",
                      "artifact": f"{qwen.where(arm)}/readside.json"}
    v.update(qwen.paired_values("randboth_minus_randheads", "RandBoth minus RandHeads", "randheads", arm="randboth"))
    v.update(qwen.paired_values("randboth_minus_randpos", "RandBoth minus RandPos", "variant", arm="randboth"))
    v.update(qwen.paired_values("qwen_randpos_minus_untrained", "RandPos minus the untrained student", "untrained"))
    v.update(smol.paired_values("smollm_randpos_minus_untrained", "RandPos minus the untrained student", "untrained"))
    return v, sorted({*qwen.inputs, *smol.inputs})


def main() -> int:
    return main_for("R-D7", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
