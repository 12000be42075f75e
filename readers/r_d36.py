"""R-D36 (App. L.4, Table 49): the third SmolLM3 Mistill seed on its own completed generations.

A descriptive within-arm comparison (no seed-matched Vanilla CoT-KD counterpart), conditional on completion and
measurable events (with none, only the coverage is written): of the arm's test generations, how many complete and how many carry a measurable P2C
recovery; on those notes, the mean own-trace recovery of the arm's own top-k (the largest and smallest k of
evaluate.own_heads.bins, the paper's 40 and 8) against the teacher-forced value on the same notes, and their paired
change.  The seed is the profile's third training seed (params distill.seeds), the one R-D29's SmolLM3 keys leave
out; the cells come from `mistill.evaluate.own_trace_readout`.
"""

from __future__ import annotations

from pathlib import Path

from mistill.errors import UserError
from mistill.evaluate.own_heads import OwnHeadsConfig
from mistill.evaluate.own_trace_readout import OwnTraceArm
from mistill.evaluate.own_traces import own_trace_root
from mistill.evaluate.readout import arm_labels, main_for, training_seeds, value

READER = "readers/r_d36.py"


def keys(params: dict) -> list[str]:
    return ["completed_traces", "measurable_traces", "owntrace_p2c_k40", "teacher_forced_p2c_k40_same_notes",
            "owntrace_minus_tf", "owntrace_minus_tf_k8",
            # registry extra_keys
            "owntrace_minus_tf_higher_notes", "generated_traces"]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    cfg = OwnHeadsConfig.from_params(params)
    k, k8 = max(cfg.bins), min(cfg.bins)
    seeds = training_seeds(params)
    if len(seeds) < 3:
        raise UserError(f"params distill.seeds {seeds}: R-D36 reads the third training seed")
    seed = seeds[2]
    artifacts = Path(cfg.artifacts)
    arm = OwnTraceArm(arm_labels(params)["smollm_mistill"], artifacts, own_trace_root(artifacts), cfg.min_range)
    if seed not in arm.seeds:
        raise UserError(f"{arm.where()}: no own-trace readout of seed {seed}; run its OWN stage")
    who = f"SmolLM3 Mistill seed {seed}"
    own, both = arm.where(), f"{arm.where()} vs {arm.where(forced=True)}"
    generated = arm.generated(seed)
    v = {"generated_traces": value(generated, f"test-note generations of {who}", own),
         "completed_traces": value(arm.completed(seed), f"generations whose reasoning block closes before the cap, of "
                                   f"{generated}, {who}", own),
         "measurable_traces": value(arm.measurable(seed, k), f"completed traces with a measurable P2C recovery at k "
                                    f"{k}, {who}", own)}
    changes = {kk: arm.change(seed, kk) for kk in (k, k8)}
    c = changes[k]
    if c is None:   # no completed trace with a measurable event: the coverage is the whole result
        return v, sorted(set(arm.inputs()))
    v["owntrace_p2c_k40"] = value(c.own, f"mean over the {c.n} notes with both values of the own top-{k} P2C recovery "
                                  f"on the own traces, {who}", own)
    v["teacher_forced_p2c_k40_same_notes"] = value(c.forced, f"mean of the teacher-forced value on those {c.n} notes, "
                                                   f"{who}", arm.where(forced=True))
    v["owntrace_minus_tf"] = value(c.mean, f"mean over {c.n} notes of own-trace minus teacher-forced own top-{k} P2C "
                                   f"recovery, {who}, {c.higher} higher", both)
    v["owntrace_minus_tf_higher_notes"] = value(c.higher, f"notes on which the own-trace value is higher, of {c.n}",
                                                both)
    if changes[k8] is not None:
        v["owntrace_minus_tf_k8"] = value(changes[k8].mean, f"the same paired mean change for the own top-{k8}, over "
                                          f"{changes[k8].n} notes", both)
    return v, sorted(set(arm.inputs()))


def main() -> int:
    return main_for("R-D36", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
