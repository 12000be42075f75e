"""R-D17 (Sec. 4.3, App. J.4, L.3, Tables 2, 3, 45-48): the precision control.

Mistill trains bf16 weights without an fp32 master copy; Vanilla CoT-KD keeps fp32 master weights. Two controls
separate precision from objective:

* Vanilla CoT-KD with bf16 weights (the main arms `<family>_vanilla_bf16`, every seed of distill.seeds): what bf16
  training costs the same objective, against fp32 Vanilla CoT-KD;
* Mistill with fp32 master weights at the λ selected in bf16 (the transferred λ: the recipe's, params
  distill.lambda_from), the Qwen student at three seeds: recipe variants `fp32mistill`, `fp32mistill1`,
  `fp32mistill2` (params variants.arms, precision fp32).

Read: the task (seed means, per-note differences with seeds averaged per note, the completed answers' precision
and recall, SmolLM3's valid rate), the training cross-entropy of the seed-0 Vanilla CoT-KD runs at both precisions
(first and last optimiser step), and the fp32 Mistill arms on their own heads (per-seed medians at P2C, the
smallest k, the M2 lift at P2C and P1), each seed-matched and note-clustered against fp32 and bf16 Vanilla CoT-KD
and bf16 Mistill.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from mistill.distill.runs import FP32_MISTILL_VARIANTS
from mistill.errors import UserError
from mistill.evaluate.compare import arm_values, clustered, seed_dirs, seed_medians
from mistill.evaluate.probe import probe_reading
from mistill.evaluate.readout import (
    ArmSeed,
    completed_precision_recall,
    load_arms,
    main_for,
    minus_reference,
    run_inputs,
    simulatability_gain_minus_reference,
    test_notes,
    value,
    where,
)
from mistill.evaluate.variants import VariantReadout
from mistill.io import read_jsonl
from mistill.stats import StatsParams

READER = "readers/r_d17.py"


def keys(params: dict) -> list[str]:
    return ["qwen_bf16_minus_fp32_vanilla_microf1", "smollm_bf16_minus_fp32_vanilla_microf1",
            "qwen_fp32_mistill_transferred_lambda_microf1", "qwen_fp32_mistill_minus_fp32_vanilla",
            "qwen_bf16_vanilla_microf1_seeds", "qwen_fp32_mistill_minus_bf16_mistill",
            "qwen_fp32_mistill_las_vs_fp32_vanilla", "qwen_fp32_mistill_m1_p2c", "qwen_fp32_mistill_own_p2c_seeds",
            "qwen_fp32_mistill_vs_fp32_vanilla_own_p2c", "qwen_fp32_mistill_vs_bf16_vanilla_own_p2c",
            "qwen_fp32_mistill_vs_bf16_mistill_own_p2c", "qwen_fp32_mistill_own_p2c_k8", "qwen_fp32_mistill_k8_probe",
            "qwen_fp32_mistill_m2_p2c_vs_bf16_vanilla", "qwen_fp32_mistill_m2_p1", "training_ce_fp32_vanilla_pilot",
            "training_ce_bf16_vanilla_selection", "smollm_bf16_vanilla_valid_rate",
            "qwen_bf16_vanilla_completed_precision_recall",
            # registry extra_keys
            "qwen_fp32_mistill_minus_fp32_vanilla_interval", "qwen_fp32_mistill_minus_bf16_mistill_interval",
            "qwen_fp32_mistill_lambda"]


def fp32_mistill(params: dict) -> dict[int, VariantReadout]:
    """The fp32 Mistill runs by seed, checked: the Qwen student, fp32 master weights, the recipe's λ."""
    reads = {}
    for name in FP32_MISTILL_VARIANTS:
        read = VariantReadout(name, params)
        entry = read.entry
        if (entry["student"], entry["precision"], entry.get("arm", "mistill")) != ("qwen", "fp32", "mistill") or (
                {"lambda_p1", "lambda_p2", "lambda_from"} & set(entry)):
            raise UserError(f"params variants.arms.{name}: the precision control is Mistill on the Qwen student with "
                            f"fp32 master weights at the transferred lambda (no lambda switch); found {entry}")
        reads[read.seed] = read
    if len(reads) != len(FP32_MISTILL_VARIANTS):
        raise UserError(f"params variants.arms {', '.join(FP32_MISTILL_VARIANTS)}: the fp32 Mistill runs need "
                        "distinct seeds")
    return reads


def cross_entropy(run: Path) -> list[float]:
    """The trace tokens' cross-entropy (the task loss) at the first and the last optimiser step of a run's log."""
    rows = [r for r in read_jsonl(run / "metrics.jsonl", "training log") if "step" in r and "cot" in r]
    if not rows:
        raise UserError(f"{run}/metrics.jsonl: no per-step cot loss")
    return [float(rows[0]["cot"]), float(rows[-1]["cot"])]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    arms = load_arms(params)
    notes = test_notes(params)
    stats = StatsParams.from_params(params)
    reads = fp32_mistill(params)
    seeds = sorted(reads)
    first = reads[seeds[0]]
    k, k8 = first.k, first.k_small
    runs: dict[int, ArmSeed] = {s: r.evaluation("variant") for s, r in reads.items()}
    lam = float(first.run_config()["arm"]["lambda_p1"])
    fp32 = f"fp32 Mistill (lambda {lam:g}, seeds {', '.join(map(str, seeds))})"
    inputs = [Path(params["evaluate"]["test_notes"]), *run_inputs(runs)]
    v: dict[str, dict] = {"qwen_fp32_mistill_lambda": value(lam, "lambda_P1 of the fp32 Mistill runs: the pick of "
                                                            "the bf16 selection", first.run_config_path)}

    def mean_f1(seed_runs: dict[int, ArmSeed]) -> float:
        return statistics.fmean(float(r.task["micro_f1"]) for r in seed_runs.values())

    # -- the task -------------------------------------------------------------------------------------
    for family in ("qwen", "smollm"):
        bf16, full = arms[f"{family}_vanilla_bf16"], arms[f"{family}_vanilla_fp32"]
        inputs += run_inputs(bf16) + run_inputs(full)
        v[f"{family}_bf16_minus_fp32_vanilla_microf1"] = value(
            mean_f1(bf16) - mean_f1(full), f"micro-F1 on the test notes, mean over seeds: Vanilla CoT-KD with bf16 "
            f"weights ({len(bf16)} seeds) minus fp32 master weights ({len(full)} seeds)", f"{where(bf16)} vs {where(full)}")
    bf16 = arms["qwen_vanilla_bf16"]
    v["qwen_bf16_vanilla_microf1_seeds"] = value([float(bf16[s].task["micro_f1"]) for s in sorted(bf16)],
                                                 "micro-F1 on the test notes per seed, Vanilla CoT-KD with bf16 weights",
                                                 where(bf16))
    v["qwen_fp32_mistill_transferred_lambda_microf1"] = value(mean_f1(runs), f"micro-F1 on the test notes, mean over "
                                                              f"seeds, {fp32}", where(runs))
    v.update(minus_reference("qwen_fp32_mistill_minus_fp32_vanilla", runs, arms["qwen_vanilla_fp32"], notes, stats,
                             f"{fp32} minus fp32 Vanilla CoT-KD"))
    v.update(minus_reference("qwen_fp32_mistill_minus_bf16_mistill", runs, arms["qwen_mistill"], notes, stats,
                             f"{fp32} minus bf16 Mistill"))
    inputs += run_inputs(arms["qwen_mistill"])
    las = simulatability_gain_minus_reference("qwen_fp32_mistill_las_vs_fp32_vanilla", runs, arms["qwen_vanilla_fp32"],
                                              notes, stats, f"{fp32} minus fp32 Vanilla CoT-KD")
    if not las:
        raise UserError(f"{where(runs)}: no LAS for any fp32 Mistill run; params simulator.arms names the runs "
                        f"whose LAS is measured (stage LAS@<label>)")
    v.update(las)
    v["qwen_fp32_mistill_m1_p2c"] = value(statistics.fmean(float(r.m1["P2C"]["p_margin_positive"])
                                                           for r in runs.values()),
                                          f"M1 at P2C (share of the teacher's events with a positive margin), mean over "
                                          f"seeds, {fp32}", where(runs))
    v["qwen_bf16_vanilla_completed_precision_recall"] = value(
        [statistics.fmean(pr) for pr in zip(*(completed_precision_recall(r, notes) for r in bf16.values()))],
        "corpus precision and recall over the valid (completed) generations, mean over seeds, Vanilla CoT-KD with "
        "bf16 weights", where(bf16))
    smol = arms["smollm_vanilla_bf16"]
    v["smollm_bf16_vanilla_valid_rate"] = value(
        statistics.fmean(statistics.fmean(bool(g.get("valid")) for g in r.generations.values()) for r in smol.values()),
        "share of test generations valid, mean over seeds, SmolLM3 Vanilla CoT-KD with bf16 weights", where(smol))
    runs_dir = Path(params["distill"]["runs_dir"]) / "DT-000"
    for precision, key in (("fp32", "training_ce_fp32_vanilla_pilot"), ("bf16", "training_ce_bf16_vanilla_selection")):
        run = runs_dir / f"student-qwen-vanilla-{precision}-s{seeds[0]}"
        inputs.append(run / "metrics.jsonl")
        v[key] = value(cross_entropy(run), f"trace-token cross-entropy at the first and the last optimiser step, "
                       f"Vanilla CoT-KD with {precision} weights, seed {seeds[0]} (the two runs share notes, recipe, "
                       f"seed and steps)", run / "metrics.jsonl")

    # -- own heads ------------------------------------------------------------------------------------
    def own(kk: int, phase: str = "P2C") -> dict[int, dict[str, float]]:
        return {s: r.notes_of("variant", phase, kk) for s, r in reads.items()}

    def main_arm(row: str, kk: int | None, phase: str, readout: str = "m4") -> dict[int, dict[str, float]]:
        root, label = Path(params["paths"]["artifacts"]), arms[row][seeds[0]].label
        values = arm_values(root, label, readout, phase=phase, k=kk, min_range=first.cfg.min_range)
        missing = [s for s in seeds if s not in values]
        if missing:
            raise UserError(f"{root}/M6/{label}-s{missing[0]}: not read; run its own-heads chain")
        inputs.extend(seed_dirs(root, label)[s] for s in seeds)
        return {s: values[s] for s in seeds}

    p2c = own(k)
    v["qwen_fp32_mistill_own_p2c_seeds"] = value(
        [seed_medians(p2c)["per_seed_median"][s] for s in seeds], f"median over test notes of the own top-{k} P2C "
        f"recovery per seed, {fp32}", ", ".join(r.where("variant") for r in reads.values()))
    v["qwen_fp32_mistill_own_p2c_k8"] = value(seed_medians(own(k8))["mean_of_seed_medians"], f"mean over seeds of "
                                              f"the median over test notes of the own top-{k8} P2C recovery, {fp32}",
                                              ", ".join(r.where("variant") for r in reads.values()))
    # the post-hoc rank probe on seed 0 (mistill.evaluate.probe; stage M6-probe)
    probe, probe_notes, probe_dir = probe_reading(params, first.name, k8, first.cfg.min_range)
    v["qwen_fp32_mistill_k8_probe"] = value(
        statistics.median(probe_notes.values()), f"median over test notes of the P2C recovery of the probe's top-{k8}, "
        f"fp32 Mistill seed {first.seed}: {probe['head']} (rank {probe['rank_in_arm']} in the arm, ranks "
        f"{probe['reference_ranks']} in the bf16 Mistill arms) moved into rank {probe['moved_to']}", probe_dir)
    inputs.append(probe_dir)
    for row, key in (("qwen_vanilla_fp32", "qwen_fp32_mistill_vs_fp32_vanilla_own_p2c"),
                     ("qwen_vanilla_bf16", "qwen_fp32_mistill_vs_bf16_vanilla_own_p2c"),
                     ("qwen_mistill", "qwen_fp32_mistill_vs_bf16_mistill_own_p2c")):
        c = clustered(p2c, main_arm(row, k, "P2C"), stats)
        v[key] = value(c["mean_difference"], f"mean over notes of the per-note difference, {fp32} minus "
                       f"{arms[row][seeds[0]].label} (own top-{k} P2C recovery), seed-matched and note-clustered; "
                       f"{c['notes_higher']} higher / {c['notes_lower']} lower of {c['n_notes']}, sign p "
                       f"{c['sign_p']:.3g}, Wilcoxon p {c['wilcoxon_p']:.3g}", f"{where(runs)} vs {where(arms[row])}")
    for phase, key in (("P2C", "qwen_fp32_mistill_m2_p2c_vs_bf16_vanilla"), ("P1", "qwen_fp32_mistill_m2_p1")):
        lift = {s: r.lift_notes("variant", phase) for s, r in reads.items()}
        c = clustered(lift, main_arm("qwen_vanilla_bf16", None, phase, "m2"), stats)
        v[key] = value(c["mean_difference"], f"mean over notes of the per-note M2 region lift difference at {phase}, "
                       f"{fp32} minus bf16 Vanilla CoT-KD, seed-matched and note-clustered; {c['notes_higher']} "
                       f"higher / {c['notes_lower']} lower of {c['n_notes']}", f"{where(runs)} vs "
                       f"{where(arms['qwen_vanilla_bf16'])}")
    inputs += [p for r in reads.values() for p in r.inputs]
    return v, sorted(set(inputs))


def main() -> int:
    return main_for("R-D17", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
