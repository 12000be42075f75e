"""R-D11 (App. L.5): three extra single-seed cells of the Mistill recipe (params variants.arms).

* `lightp1`: a lighter phase-1 weight (lambda_P1 below the pick, lambda_P2 the pick) on the Qwen student, seed 0: micro-F1,
  the per-note F1 difference from Mistill at seed 0 with its bootstrap interval, and M1 at P1, P2 and P2C;
* `replicate2`: Mistill seed 2 trained again with nothing changed, read against the original seed-2 run.  Its
  differences are the training noise of class T: corpus micro-F1, M1 at P2C and LAS (App. K's simulatability
  gain; Hase et al.'s leakage-adjusted LAS beside it, beyond the paper) of both runs, the absolute
  differences, and the test notes on which the replicate's per-note F1 is higher and lower with the exact sign
  test.  The paper's replicate ran on another GPU type; a replicate on the same machine measures what that
  machine's kernels leave of it;
* `smolattnonly`: SmolLM3 with the attention term alone, seed 0: micro-F1, the valid and token-cap shares of
  its generations, M1 at P1, P2 and P2C, LAS (and the leakage-adjusted LAS beside it), and the notes on which
  it is higher and lower than Mistill with both terms at seed 0.
"""

from __future__ import annotations

from pathlib import Path

from mistill.distill.runs import VARIANT_IDENTITY, VARIANT_RUN_OPTIONS
from mistill.errors import UserError
from mistill.evaluate.readout import (
    SIMULATABILITY_GAIN,
    ArmSeed,
    cap_share,
    las_path,
    leakage_adjusted_of,
    leakage_adjusted_text,
    main_for,
    per_note_f1,
    simulatability_gain_of,
    test_notes,
    value,
)
from mistill.evaluate.variants import VariantReadout
from mistill.stats import sign_test

READER = "readers/r_d11.py"
PHASES = ("P1", "P2", "P2C")


def keys(params: dict) -> list[str]:
    return ["qwen_lambda_p1_003_microf1", "replicate_seed2_other_gpu_microf1", "original_seed2_microf1",
            "smollm_attn_only_microf1", "qwen_lambda_p1_003_vs_mistill", "qwen_lambda_p1_003_m1_p1_p2_p2c",
            "replicate_paired_notes", "replicate_m1_p2c", "t_noise_microf1_m1p2c_las", "smollm_attn_only_valid_cap",
            "smollm_attn_only_vs_both_terms_s0", "smollm_attn_only_m1_p1_p2_p2c", "smollm_attn_only_las",
            # registry extra_keys
            "qwen_lambda_p1_003_vs_mistill_interval", "qwen_lambda_p1_003_lambdas", "original_seed2_m1_p2c",
            "replicate_las_original_las", "smollm_both_terms_s0_microf1",
            # Hase et al.'s leakage-adjusted LAS beside App. K's (mistill.evaluate.leakage_adjusted)
            "replicate_las_original_las_leakage_adjusted", "smollm_attn_only_las_leakage_adjusted"]


def notes_higher(arm: ArmSeed, reference: ArmSeed, notes) -> tuple[int, int, float]:
    """Notes on which `arm`'s per-note F1 is higher and lower than `reference`'s, and the exact sign test's p."""
    test = sign_test([a - b for a, b in zip(per_note_f1(arm, notes), per_note_f1(reference, notes))])
    return test.n_positive, test.n_negative, test.p_value


def checked(params: dict, name: str, student: str, changes: set[str]) -> VariantReadout:
    """The variant `name`, checked to be Mistill on `student` changing no more than `changes` of the recipe."""
    read = VariantReadout(name, params)
    entry = read.entry
    extra = set(entry) - set(VARIANT_IDENTITY) - set(VARIANT_RUN_OPTIONS) - changes   # how it runs is no change
    if entry["student"] != student or entry.get("arm", "mistill") != "mistill" or extra:
        raise UserError(f"params variants.arms.{name}: R-D11 reads Mistill on the {student} student changing "
                        f"{', '.join(sorted(changes)) or 'nothing'}; found {entry}")
    return read


def m1_by_phase(read: VariantReadout, what: str, reference: str) -> dict:
    """M1 of the variant at P1, P2 and P2C, Mistill's at its seed named in the statistic."""
    return value([read.m1("variant", p) for p in PHASES],
                 f"M1 at {', '.join(PHASES)}, {what}; {reference}: "
                 + ", ".join(f"{read.m1('mistill', p):.3f}" for p in PHASES),
                 f"{read.evaluation('variant').path}/m1.json")


def simulatability_gain(run: ArmSeed) -> float:
    """App. K's LAS of a run."""
    measured = simulatability_gain_of(run)
    if measured is None:
        raise UserError(f"{las_path(run)}: no LAS; params simulator.arms names the runs stage LAS measures")
    return measured[0]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    notes = test_notes(params)
    v: dict[str, dict] = {}

    # -- a lighter phase-1 weight --------------------------------------------------------------------
    light = checked(params, "lightp1", "qwen", {"lambda_p1"})
    arm = light.run_config()["arm"]
    lams = [float(arm["lambda_p1"]), float(arm["lambda_p2"])]
    if not lams[0] < lams[1]:
        raise UserError(f"params variants.arms.lightp1: lambda_p1 {lams[0]:g} is not below the pick {lams[1]:g}")
    what = f"Mistill with lambda_P1 {lams[0]:g} (lambda_P2 {lams[1]:g}), seed {light.seed}"
    v["qwen_lambda_p1_003_lambdas"] = value(lams, "lambda_P1, lambda_P2 of the lighter phase-1 run (its config)",
                                            light.run_config_path)
    v["qwen_lambda_p1_003_microf1"] = value(light.micro_f1("variant"), f"corpus micro-F1 on the test notes, {what}",
                                            f"{light.evaluation('variant').path}/task.json")
    v.update(light.f1_versus_values("qwen_lambda_p1_003_vs_mistill", f"{what} minus Mistill at the pick", "mistill"))
    v["qwen_lambda_p1_003_m1_p1_p2_p2c"] = m1_by_phase(light, what, "Mistill at the pick")

    # -- the same-seed replicate ----------------------------------------------------------------------
    rep = checked(params, "replicate2", "qwen", set())
    replicate, original = rep.evaluation("variant"), rep.evaluation("mistill")
    f1s = [float(replicate.task["micro_f1"]), float(original.task["micro_f1"])]
    m1s = [rep.m1("variant", "P2C"), rep.m1("mistill", "P2C")]
    lases = [simulatability_gain(replicate), simulatability_gain(original)]
    v["replicate_seed2_other_gpu_microf1"] = value(f1s[0], f"corpus micro-F1 on the test notes, Mistill seed "
                                                  f"{rep.seed} trained again", f"{replicate.path}/task.json")
    v["original_seed2_microf1"] = value(f1s[1], f"corpus micro-F1 on the test notes, Mistill seed {rep.seed}",
                                        f"{original.path}/task.json")
    v["replicate_m1_p2c"] = value(m1s[0], f"M1 at P2C, the replicate of Mistill seed {rep.seed} (original "
                                  f"{m1s[1]:.3f})", f"{replicate.path}/m1.json")
    v["original_seed2_m1_p2c"] = value(m1s[1], f"M1 at P2C, Mistill seed {rep.seed}", f"{original.path}/m1.json")
    v["replicate_las_original_las"] = value(lases, f"{SIMULATABILITY_GAIN} of the replicate and of the original "
                                            f"Mistill seed {rep.seed}", f"{las_path(replicate)}, {las_path(original)}")
    adjusted = [leakage_adjusted_of(replicate), leakage_adjusted_of(original)]
    if all(a is not None for a in adjusted):
        v["replicate_las_original_las_leakage_adjusted"] = value(
            [a["value"] for a in adjusted], f"leakage-adjusted LAS (Hase et al. 2020) of the replicate and of the "
            f"original Mistill seed {rep.seed}", f"{las_path(replicate)}, {las_path(original)}")
    v["t_noise_microf1_m1p2c_las"] = value([abs(a - b) for a, b in (f1s, m1s, lases)],
                                           f"absolute replicate-minus-original differences of corpus micro-F1, M1 at "
                                           f"P2C and {SIMULATABILITY_GAIN}: the training noise of one seed",
                                           f"{replicate.path} vs {original.path}")
    h, lo, p = notes_higher(replicate, original, notes)
    v["replicate_paired_notes"] = value(h, f"test notes on which the replicate's per-note F1 is higher than the "
                                        f"original's; {lo} lower, {len(notes) - h - lo} tied, exact sign test p "
                                        f"{p:.3g}", f"{replicate.path} vs {original.path}")

    # -- SmolLM3 with the attention term alone --------------------------------------------------------
    attn = checked(params, "smolattnonly", "smol", {"terms"})
    if list(attn.entry["terms"]) != ["attn"]:
        raise UserError(f"params variants.arms.smolattnonly: terms {attn.entry['terms']}; R-D11 reads [attn]")
    alone, both = attn.evaluation("variant"), attn.evaluation("mistill")
    rows = list(alone.generations.values())
    v["smollm_attn_only_microf1"] = value(float(alone.task["micro_f1"]), f"corpus micro-F1 on the test notes, SmolLM3 "
                                          f"Mistill with the attention term alone, seed {attn.seed}",
                                          f"{alone.path}/task.json")
    v["smollm_both_terms_s0_microf1"] = value(float(both.task["micro_f1"]), f"corpus micro-F1 on the test notes, "
                                              f"SmolLM3 Mistill with both terms, seed {attn.seed}",
                                              f"{both.path}/task.json")
    v["smollm_attn_only_valid_cap"] = value([sum(bool(r.get("valid")) for r in rows) / len(rows), cap_share(alone)],
                                            "shares of the test generations that are valid and that reached the token "
                                            "cap, SmolLM3 with the attention term alone", f"{alone.path}/generations.jsonl")
    h, lo, p = notes_higher(alone, both, notes)
    v["smollm_attn_only_vs_both_terms_s0"] = value(h, f"test notes on which the attention term alone is higher than "
                                                   f"both terms (SmolLM3 Mistill, seed {attn.seed}, per-note F1); {lo} "
                                                   f"lower, exact sign test p {p:.3g}", f"{alone.path} vs {both.path}")
    v["smollm_attn_only_m1_p1_p2_p2c"] = m1_by_phase(attn, f"SmolLM3 with the attention term alone, seed {attn.seed}",
                                                     "both terms")
    v["smollm_attn_only_las"] = value(simulatability_gain(alone), f"{SIMULATABILITY_GAIN}, SmolLM3 with the attention "
                                      f"term alone, seed {attn.seed}; both terms: {simulatability_gain(both):.3f}",
                                      las_path(alone))
    adjusted = leakage_adjusted_of(alone)
    if adjusted is not None:
        v["smollm_attn_only_las_leakage_adjusted"] = value(
            adjusted["value"], f"SmolLM3 with the attention term alone: {leakage_adjusted_text(alone, adjusted)}",
            las_path(alone))
    inputs = [Path(params["evaluate"]["test_notes"]), las_path(replicate), las_path(original), las_path(alone),
              las_path(both),
              *light.inputs, *rep.inputs, *attn.inputs]
    return v, sorted(set(inputs))


def main() -> int:
    return main_for("R-D11", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
