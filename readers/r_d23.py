"""R-D23 (Sec. 4.5, App. M.1, Table 51): Vanilla CoT-KD with its token loss up-weighted at the teacher's events.

The recipe variant evw4 (params variants.arms: arm vanilla, event_weight 4) trains Vanilla CoT-KD with its CE
and KL multiplied by 4 at each realised event's decision row and at the window rows before each P1 event, the
positions Mistill supervises, and no attention term.  Read beside fp32 Vanilla CoT-KD and Mistill at its seed
(`mistill.evaluate.variants.VariantReadout`):

* own-heads knock-in recovery at P2C of the arm's own top-k, at the largest and smallest k of
  evaluate.own_heads.bins (the paper's 40 and 8), against plain Vanilla's;
* the paired per-note differences against Mistill and against plain Vanilla (note-clustered means), and the
  notes on which it lies below Mistill at both k;
* micro-F1, M1 at P2C and the share of generations at the token cap;
* the extra loss the weights add at the first and last optimiser step, against Mistill's mechanism terms at
  the same steps (`mistill.distill.dose.step_extra`): the up-weighting is meant to put a comparable pressure
  on the same positions.
"""

from __future__ import annotations

from pathlib import Path

from mistill.distill.dose import step_extra
from mistill.distill.runs import run_dir, variant_run_dir
from mistill.evaluate.readout import main_for, value
from mistill.evaluate.variants import VariantReadout

READER = "readers/r_d23.py"


def keys(params: dict) -> list[str]:
    return ["evw4_own_p2c_k40", "evw4_own_p2c_k8", "evw4_vs_mistill_s0_p2c", "evw4_microf1",
            "plain_vanilla_own_p2c_k40_k8", "evw4_minus_vanilla", "evw4_below_mistill_notes_k40_k8", "evw4_m1_p2c",
            "evw4_cap_rate", "extra_loss_start_evw4_vs_mistill",
            # registry extra_keys
            "evw4_vs_mistill_s0_p2c_interval", "evw4_minus_vanilla_interval", "vanilla_m1_p2c",
            "extra_loss_end_evw4_vs_mistill"]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    read = VariantReadout("evw4", params)
    k, k8 = read.k, read.k_small
    v = {"evw4_own_p2c_k40": read.own_value("variant", "P2C"), "evw4_own_p2c_k8": read.own_value("variant", "P2C", k8),
         "evw4_microf1": read.f1_value("variant")}
    v["plain_vanilla_own_p2c_k40_k8"] = value(
        [read.own_median("vanilla", "P2C"), read.own_median("vanilla", "P2C", k8)],
        f"medians over test notes of per-note mean recovery of fp32 Vanilla CoT-KD's own top-{k} and top-{k8} at "
        f"P2C, seed {read.seed}", read.where("vanilla"))
    v.update(read.paired_values("evw4_vs_mistill_s0_p2c", "event-weighted Vanilla minus Mistill", "mistill"))
    v.update(read.paired_values("evw4_minus_vanilla", "event-weighted minus plain Vanilla", "vanilla"))
    below = [read.versus("variant", "mistill", "P2C", kk) for kk in (k, k8)]
    v["evw4_below_mistill_notes_k40_k8"] = value(
        [c["notes_lower"] for c in below], f"notes on which the own top-{k} and top-{k8} P2C recovery lies below "
        f"Mistill's, of {below[0]['n_notes']} (seed {read.seed})", f"{read.where('variant')} vs {read.where('mistill')}")
    for key, arm in (("evw4_m1_p2c", "variant"), ("vanilla_m1_p2c", "vanilla")):
        v[key] = value(read.m1(arm, "P2C"), f"M1 at P2C: share of the teacher's events with a positive student "
                       f"margin, seed {read.seed}", f"{read.evaluation(arm).path}/m1.json")
    v["evw4_cap_rate"] = value(read.cap_share("variant"), f"share of test generations that reached the token cap, "
                               f"seed {read.seed}", f"{read.evaluation('variant').path}/generations.jsonl")

    distill = params["distill"]
    runs = (variant_run_dir(params["variants"]["dir"], "evw4", read.entry),
            run_dir(distill["runs_dir"], f"student_{read.entry['student']}", "mistill", distill["precision"]["mistill"],
                    read.seed))
    read.inputs += [r / name for r in runs for name in ("metrics.jsonl", "config.json")]
    for key, first in (("extra_loss_start_evw4_vs_mistill", True), ("extra_loss_end_evw4_vs_mistill", False)):
        v[key] = value([step_extra(r, first=first) for r in runs],
                       f"loss added to the CoT loss at the {'first' if first else 'last'} optimiser step, "
                       f"event-weighted Vanilla and Mistill (seed {read.seed}), nats", f"{runs[0]}, {runs[1]}")
    return {key: cell for key, cell in v.items() if cell is not None}, sorted(set(read.inputs))


def main() -> int:
    return main_for("R-D23", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
