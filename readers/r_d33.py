"""R-D33 (App. N.3, Table 54): the evidence-flip test, behavioural half.

From EF-generate-*'s answers (`mistill evaluate ef-generate`; `mistill.evaluate.evidence_flip.behaviour`)
on the accepted cases of EF-authored (verified against their frozen hashes): per checkpoint the
directional sensitivity D (mean over cases, case-bootstrap interval), the follow rates, paired success,
the control statistics and D's decomposition; the locked primary, params evidence_flip's student at its
precision, Mistill minus Vanilla CoT-KD with the seed-matched pair differences averaged within each case
(bootstrap over cases, exact sign test, approximate detectable effect).  The control statistics leave
out cases whose irrelevant edit fell short of its matched length.

`control_sensitivity_max` reads App. N.3's "on the 32 cases without the one case whose irrelevant edit
fell one word short of its matched length, the agreement moves by at most 0.014 and the expected rate
by at most 0.020" as how far the two control statistics move when the short cases are dropped
(`behaviour.control_sensitivity`); the reading of the control statistics themselves (one minus the
agreement, the A-only rate's shift against the original's) is `control_disagreement_max`.  The
category-level secondary is the primary difference with answers scored by three-character category,
on the cases whose A and B lie in different categories.  The secondary pair (App. N.3: "the secondary
is the fp32 pair at lambda = 0.01") is params evidence_flip.secondary: fp32 Mistill at the lambda
selected for fp32 against fp32 Vanilla CoT-KD, seed for seed (stage EF-generate-secondary), read like the
primary; its checkpoints enter the control statistics, which run over every checkpoint of Table 54.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.evaluate.evidence_flip.behaviour import (
    CONTROLS,
    category,
    control_sensitivity,
    detectable_effect,
    paired_case_differences,
    readings,
)
from mistill.evaluate.evidence_flip.cohort import CohortRules
from mistill.evaluate.evidence_flip.commands import FlipSettings, accepted_cases, primary_arm
from mistill.instrument.readout import run_reader, value
from mistill.io import read_jsonl
from mistill.stats import StatsParams, bootstrap_mean, sign_test

READER = "readers/r_d33.py"
TABLE54 = ("D", "s", "follow original (A-only)", "follow flipped (B-only)", "paired success",
           "agreement irrelevant", "agreement order", "A-only irrelevant", "A-only order", "invalid",
           "losing A", "adopting B")


def checkpoints(params: dict) -> dict[str, list[str]]:
    """Table 54 row group -> its checkpoints' generation labels: the teacher, then the primary pair's arms
    with one checkpoint per seed of distill.seeds (in that order)."""
    return {"teacher": ["teacher"],
            **{objective: [primary_arm(params, objective, seed) for seed in params["distill"]["seeds"]]
               for objective in ("mistill", "vanilla")}}


def keys(params: dict) -> list[str]:
    rows = checkpoints(params)
    return ["teacher_directional_sensitivity_d", "teacher_directional_sensitivity_d_interval",
            "primary_delta_d_mistill_minus_vanilla_bf16", "primary_delta_d_mistill_minus_vanilla_bf16_interval",
            "primary_delta_d_sign_test", "detectable_delta", "teacher_flipped_answers_b", "teacher_paired_success",
            "bf16_mistill_d_seeds", "bf16_vanilla_d_seeds", "bf16_mistill_follow_flip", "bf16_mistill_paired_success",
            "pooled_per_case_diff_sd", "preregistered_min_effect", "control_sensitivity_max",
            "control_disagreement_max", "cases", "category_secondary_cases", "category_secondary_delta_d",
            "category_secondary_delta_d_interval", "secondary_delta_d_fp32", "secondary_delta_d_fp32_interval",
            "secondary_fp32_d_seeds",
            *(f"table54_{group}" for group in rows)]


def table54_row(reading_by_case: dict, control_cases: list[str]) -> list[float]:
    r = list(reading_by_case.values())
    controls = [reading_by_case[c] for c in control_cases if c in reading_by_case]

    def mean(f, rows=r):
        return float(np.mean([f(x) for x in rows])) if rows else float("nan")

    return [mean(lambda x: x.d), mean(lambda x: (x.rate("original", 1) + x.rate("flipped", -1)) / 2),
            mean(lambda x: x.rate("original", 1)), mean(lambda x: x.rate("flipped", -1)),
            mean(lambda x: x.paired_success),
            *(mean(lambda x, c=c: x.agreement(c), controls) for c in CONTROLS),
            *(mean(lambda x, c=c: x.rate(c, 1), controls) for c in CONTROLS),
            float(sum(x.invalid for x in r)), mean(lambda x: x.losing_a), mean(lambda x: x.adopting_b)]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    settings = FlipSettings.from_params(params)
    rules = CohortRules.from_params(params)
    stats = StatsParams.from_params(params)
    cases = accepted_cases(settings)
    pairs = {c["case"]: (c["code"], c["partner"]) for c in cases}
    control_cases = sorted(c["case"] for c in cases if c["irrelevant_words_short"] == 0)
    gen_dir = settings.out_dir / "gen"
    other_category = {case: (a, b) for case, (a, b) in pairs.items() if category(a) != category(b)}
    read, by_category, inputs = {}, {}, [settings.cases_dir / "cohort_row.json"]
    groups = checkpoints(params)
    for group, labels in groups.items():
        for seed, label in zip(params["distill"]["seeds"] if group != "teacher" else [None], labels):
            path = gen_dir / label / "generations.jsonl"
            if path.exists():
                row = group if seed is None else f"{group}_s{seed}"
                generations = read_jsonl(path)
                read[row] = readings(generations, pairs)
                by_category[row] = readings(generations, other_category, level="category")
                inputs.append(path)
    secondary: dict[str, dict] = {"mistill": {}, "vanilla": {}}
    for label, item in (params["evidence_flip"].get("secondary") or {}).items():
        path = gen_dir / label / "generations.jsonl"
        if path.exists():
            seed = int(item["seed"])
            read[f"secondary_{item['objective']}_s{seed}"] = secondary[item["objective"]][seed] = readings(
                read_jsonl(path), pairs)
            inputs.append(path)
    art = f"{gen_dir}/*/generations.jsonl"
    v: dict[str, dict] = {
        "cases": value(len(cases), "count of accepted cases", art),
        "preregistered_min_effect": value(rules.min_effect, "delta in D (locked)", f"{settings.cohort_dir}/LOCK.json")}

    def interval(values):
        return bootstrap_mean(values, n_resamples=stats.bootstrap_resamples, seed=stats.bootstrap_seed,
                              confidence=stats.confidence)

    # one key per row group: the teacher's row, or the arm's rows seed after seed (12 values each), so the
    # keys do not depend on how many seeds a profile trains
    for group in groups:
        rows = [table54_row(by_case, control_cases) for row, by_case in read.items()
                if row == group or row.startswith(f"{group}_s")]
        if rows:
            v[f"table54_{group}"] = value([x for r in rows for x in r], f"per checkpoint, seeds in order, mean over "
                                          f"{len(cases)} cases: [" + ", ".join(TABLE54) + "]", art)
    if "teacher" in read:
        teacher = read["teacher"]
        d = interval([x.d for x in teacher.values()])
        v["teacher_directional_sensitivity_d"] = value(d.estimate, f"D, mean over {len(teacher)} cases", art)
        v["teacher_directional_sensitivity_d_interval"] = value(
            [d.low, d.high], f"{stats.confidence:.0%} percentile bootstrap over cases", art)
        v["teacher_flipped_answers_b"] = value(float(np.mean([x.rate("flipped", -1) for x in teacher.values()])),
                                               "share of flipped outputs answering B only", art)
        v["teacher_paired_success"] = value(float(np.mean([x.paired_success for x in teacher.values()])),
                                            "share of sample pairs, A only then B only", art)
    seeds = list(params["distill"]["seeds"])
    mistill = {s: read[f"mistill_s{s}"] for s in seeds if f"mistill_s{s}" in read}
    vanilla = {s: read[f"vanilla_s{s}"] for s in seeds if f"vanilla_s{s}" in read}
    if mistill:
        v["bf16_mistill_d_seeds"] = value([float(np.mean([x.d for x in r.values()])) for r in mistill.values()],
                                          "D per seed, mean over cases", art)
        follow = [float(np.mean([x.rate("flipped", -1) for x in r.values()])) for r in mistill.values()]
        v["bf16_mistill_follow_flip"] = value([min(follow), max(follow)], "range over seeds of the B-only share "
                                              "of flipped outputs", art)
        v["bf16_mistill_paired_success"] = value(
            float(np.mean([x.paired_success for r in mistill.values() for x in r.values()])),
            "share of sample pairs, A only then B only, pooled over seeds", art)
    if vanilla:
        v["bf16_vanilla_d_seeds"] = value([float(np.mean([x.d for x in r.values()])) for r in vanilla.values()],
                                          "D per seed, mean over cases", art)
    differences = paired_case_differences(mistill, vanilla)
    if len(differences) > 1:
        diff = list(differences.values())
        primary = interval(diff)
        test = sign_test(diff)
        n_pairs = len(set(mistill) & set(vanilla))
        v["primary_delta_d_mistill_minus_vanilla_bf16"] = value(
            primary.estimate, f"mean over {len(diff)} cases of the mean over {n_pairs} seed pairs", art)
        v["primary_delta_d_mistill_minus_vanilla_bf16_interval"] = value(
            [primary.low, primary.high], f"{stats.confidence:.0%} percentile bootstrap over cases", art)
        v["primary_delta_d_sign_test"] = value(
            [test.n_positive, test.n_negative, test.n_zero, test.p_value],
            "cases higher, lower, tied; exact sign test p", art)
        v["pooled_per_case_diff_sd"] = value(float(np.std(diff, ddof=1)), "SD of the per-case differences", art)
        v["detectable_delta"] = value(detectable_effect(diff), "approx. detectable delta (80% power, two-sided "
                                      "0.05, normal approximation)", art)
    secondary_differences = paired_case_differences(secondary["mistill"], secondary["vanilla"])
    if len(secondary_differences) > 1:
        diff = interval(list(secondary_differences.values()))
        n_pairs = len(set(secondary["mistill"]) & set(secondary["vanilla"]))
        v["secondary_delta_d_fp32"] = value(diff.estimate, f"fp32 Mistill at the lambda selected for fp32 minus fp32 "
                                            f"Vanilla CoT-KD: mean over {len(secondary_differences)} cases of the mean "
                                            f"over {n_pairs} seed pairs", art)
        v["secondary_delta_d_fp32_interval"] = value([diff.low, diff.high], f"{stats.confidence:.0%} percentile "
                                                     "bootstrap over cases", art)
        v["secondary_fp32_d_seeds"] = value(
            [float(np.mean([x.d for x in secondary[o][s].values()])) for o in ("mistill", "vanilla")
             for s in sorted(secondary[o])], "D per checkpoint, mean over cases: fp32 Mistill's seeds, then fp32 "
            "Vanilla CoT-KD's", art)
    # per checkpoint and control: 1 - the mean agreement with the original's v, and the shift of the
    # A-only rate against the original's; the largest over checkpoints and controls
    shifts = []
    for by_case in read.values():
        kept = [x for case, x in by_case.items() if case in control_cases]
        for c in CONTROLS:
            if kept:
                shifts.append((1 - float(np.mean([x.agreement(c) for x in kept])),
                               abs(float(np.mean([x.rate(c, 1) - x.rate("original", 1) for x in kept])))))
    if shifts:
        v["control_disagreement_max"] = value(
            [max(a for a, _ in shifts), max(b for _, b in shifts)],
            "largest over checkpoints and controls: [1 - agreement, expected-rate shift]", art)
        v["control_sensitivity_max"] = value(
            list(control_sensitivity(read, control_cases)),
            f"largest change over checkpoints and controls without the {len(cases) - len(control_cases)} short "
            "cases: [agreement, expected rate]", art)
    # the category-level secondary: the primary's difference with answers scored by category
    v["category_secondary_cases"] = value(len(other_category), "count of accepted cases whose A and B are in "
                                          "different categories", art)
    category_differences = paired_case_differences(
        {s: by_category[f"mistill_s{s}"] for s in seeds if f"mistill_s{s}" in by_category},
        {s: by_category[f"vanilla_s{s}"] for s in seeds if f"vanilla_s{s}" in by_category})
    if len(category_differences) > 1:
        secondary = interval(list(category_differences.values()))
        v["category_secondary_delta_d"] = value(secondary.estimate, f"mean over {len(category_differences)} "
                                                "cases, answers scored by category", art)
        v["category_secondary_delta_d_interval"] = value(
            [secondary.low, secondary.high], f"{stats.confidence:.0%} percentile bootstrap over cases", art)
    return {k: x for k, x in v.items() if np.all(np.isfinite(np.asarray(x["value"], dtype=float)))}, inputs


def main() -> int:
    return run_reader("R-D33", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
