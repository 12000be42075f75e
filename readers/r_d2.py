"""R-D2 (Table 2, App. L.1, L.2): Vanilla CoT-KD with fp32 master weights against the untrained students.

Reads the arms' `<artifacts>/DT-eval/<label>-s<seed>/` directories (see readers/r_d1.py) for the
rows qwen_vanilla_fp32, smollm_vanilla_fp32 and the untrained rows, and the teacher's TR-008
traces on the same test notes. Task values are means over the seeds present (their s.d. only with
two or more seeds); the paired per-note comparison averages each note's F1 over seeds first
(`mistill.stats.mean_over_seeds`) and reports the percentile-bootstrap mean difference with
its interval, Wilcoxon and sign tests (`mistill.stats.paired_comparison`, App. K "Statistics").
Gap recovered is (arm - untrained) / (teacher - untrained) on corpus micro-F1 (App. K).  LAS, App. K's
simulatability gain, is read from stage LAS (`<artifacts>/LAS/<label>-s<seed>/las.json`), and beside it, beyond
the paper, Hase et al.'s leakage-adjusted LAS (`<family>_vanilla_las_leakage_adjusted`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mistill.errors import UserError
from mistill.evaluate.readout import (
    GENERATION_BEHAVIOUR,
    arm_labels,
    completed_precision_recall,
    generation_behaviour,
    las_path,
    leakage_adjusted_of,
    leakage_adjusted_text,
    load_arms,
    m1_shares,
    m1_text,
    main_for,
    paired_text,
    per_note_f1,
    per_note_mean_over_seeds,
    seed_mean_sd,
    seeds_text,
    simulatability_gain_of,
    simulatability_gain_text,
    teacher_micro_f1,
    test_notes,
    training_seeds,
    value,
    where,
)

READER = "readers/r_d2.py"


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params`: s.d. over seeds with two or more training seeds,
    the seed-0 values when seed 0 is trained, the comparisons when the untrained row is named."""
    labels, seeds = arm_labels(params), training_seeds(params)
    out = []
    for family in ("qwen", "smollm"):
        if f"{family}_vanilla_fp32" not in labels:
            continue
        out += [f"{family}_vanilla_fp32_microf1", f"{family}_vanilla_fp32_microf1_seeds",
                f"{family}_vanilla_fp32_valid_rate"]
        out += [f"{family}_vanilla_fp32_{what}" for what in GENERATION_BEHAVIOUR]
        out += [f"{family}_vanilla_fp32_microf1_sd"] if len(seeds) >= 2 else []
        if f"{family}_untrained" in labels:
            out += [f"{family}_vanilla_minus_untrained", f"{family}_vanilla_gap_recovered"]
        if 0 in seeds:
            out += [f"{family}_vanilla_fp32_seed0_microf1", f"{family}_vanilla_fp32_bleu4",
                    f"{family}_vanilla_fp32_trace_ppl", f"{family}_vanilla_las", f"{family}_vanilla_las_leakage_adjusted",
                    f"{family}_vanilla_fp32_m1_p1_p2c",
                    f"{family}_vanilla_fp32_tail_macro_f1", f"{family}_vanilla_fp32_completed_precision_recall"]
    return out


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    from mistill.stats import StatsParams, gap_recovered, paired_comparison

    arms = load_arms(params)
    notes = test_notes(params)
    stats = StatsParams.from_params(params)
    v: dict = {}
    inputs: list[Path] = []
    for family in ("qwen", "smollm"):
        row = f"{family}_vanilla_fp32"
        if row not in arms:
            continue
        seeds = arms[row]
        for arm in seeds.values():
            inputs += arm.files()
        mean, sd, per_seed = seed_mean_sd(seeds, "micro_f1")
        v[f"{family}_vanilla_fp32_microf1"] = value(mean, f"corpus micro-F1, mean over {seeds_text(seeds)}, "
                                                    f"{len(notes)} test notes", where(seeds))
        if sd is not None:
            v[f"{family}_vanilla_fp32_microf1_sd"] = value(sd, f"s.d. over {seeds_text(seeds)}", where(seeds))
        v[f"{family}_vanilla_fp32_microf1_seeds"] = value(per_seed, f"corpus micro-F1 per seed, {seeds_text(seeds)}",
                                                          where(seeds))
        v[f"{family}_vanilla_fp32_valid_rate"] = value(
            seed_mean_sd(seeds, "valid_rate")[0], f"share of generations valid, mean over {seeds_text(seeds)}",
            where(seeds))
        v.update(generation_behaviour(seeds, row))
        base_row = f"{family}_untrained"
        if base_row in arms:
            base = arms[base_row][min(arms[base_row])]
            inputs += base.files()
            c = paired_comparison(per_note_mean_over_seeds(seeds, notes), per_note_f1(base, notes),
                                  n_resamples=stats.bootstrap_resamples, seed=stats.bootstrap_seed,
                                  confidence=stats.confidence)
            v[f"{family}_vanilla_minus_untrained"] = value(
                c.mean_difference.estimate, paired_text(c, f"fp32 Vanilla CoT-KD ({seeds_text(seeds)}) minus untrained"),
                f"{where(seeds)} vs {base.path}")
            teacher, teacher_path = teacher_micro_f1(params, notes)
            inputs.append(teacher_path)
            v[f"{family}_vanilla_gap_recovered"] = value(
                gap_recovered(mean, float(base.task["micro_f1"]), teacher),
                f"(arm - untrained) / (teacher - untrained) on corpus micro-F1 (arm: mean over {seeds_text(seeds)}; "
                f"untrained {base.task['micro_f1']:.4f}, teacher {teacher:.4f} on its TR-008 traces)",
                f"{where(seeds)}, {base.path}, {teacher_path}")
        if 0 in seeds:
            arm = seeds[0]
            v[f"{family}_vanilla_fp32_seed0_microf1"] = value(arm.task["micro_f1"], "corpus micro-F1, seed 0", arm.path)
            if "bleu4" in arm.fidelity:
                v[f"{family}_vanilla_fp32_bleu4"] = value(
                    arm.fidelity["bleu4"], "mean over test notes of sentence BLEU-4 of the reasoning block against "
                    "the teacher's (whitespace tokens, no smoothing), seed 0", arm.path / "fidelity.json")
            if "ppl_median" in arm.fidelity:
                v[f"{family}_vanilla_fp32_trace_ppl"] = value(
                    arm.fidelity["ppl_median"], "median over test notes of teacher-trace perplexity, seed 0",
                    arm.path / "fidelity.json")
            gain = simulatability_gain_of(arm)
            if gain is not None:
                inputs.append(las_path(arm))
                v[f"{family}_vanilla_las"] = value(gain[0], simulatability_gain_text(arm), las_path(arm))
            adjusted = leakage_adjusted_of(arm)
            if adjusted is not None:
                v[f"{family}_vanilla_las_leakage_adjusted"] = value(adjusted["value"],
                                                                    leakage_adjusted_text(arm, adjusted), las_path(arm))
            shares = m1_shares(arm, ("P1", "P2C"))
            if shares is not None:
                v[f"{family}_vanilla_fp32_m1_p1_p2c"] = value(shares, m1_text(arm, ("P1", "P2C")) + ", seed 0",
                                                              arm.path / "m1.json")
            tail = arm.task.get("tail_macro_f1")
            if tail is not None and tail == tail:
                v[f"{family}_vanilla_fp32_tail_macro_f1"] = value(
                    tail, "macro-F1 over tail codes (training-split frequency), seed 0", arm.path)
            try:
                v[f"{family}_vanilla_fp32_completed_precision_recall"] = value(
                    completed_precision_recall(arm, notes), "corpus precision, recall over the valid generations, "
                    "seed 0", arm.path / "generations.jsonl")
            except UserError as err:  # no completed answer: the key is left out, named on stderr
                print(f"{READER}: {family} completed precision/recall left out: {err}", file=sys.stderr)
    return v, inputs


if __name__ == "__main__":
    raise SystemExit(main_for("R-D2", READER, compute_values, keys))
