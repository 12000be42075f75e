"""R-D5 (Sec. 4.3, Table 2, App. L): Mistill (bf16) against Vanilla CoT-KD trained at the same bf16 precision.

Reads the arms' `<artifacts>/DT-eval/<label>-s<seed>/` directories (see readers/r_d1.py) for the
rows {qwen,smollm}_mistill, {qwen,smollm}_vanilla_bf16 (and qwen_vanilla_fp32 for M1). Task values:
corpus micro-F1, mean and s.d. over the seeds present. The per-note comparison averages each
note's F1 over seeds first and reports the percentile-bootstrap mean difference with its interval
(`mistill.stats.paired_comparison`). The note-pair counts and pooled M1 differences pair each
Mistill seed with the bf16 Vanilla seed of the same number (seed-matched) and pool the note-pairs
over seed pairs (App. L, descriptive): a note-pair counts for Mistill when its per-note value is
higher (per-note F1; per-note M1 share at the phase's events).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.evaluate.readout import (
    GENERATION_BEHAVIOUR,
    ArmSeed,
    arm_labels,
    completed_precision_recall,
    generation_behaviour,
    load_arms,
    m1_shares,
    m1_text,
    main_for,
    paired_text,
    per_note_f1,
    per_note_mean_over_seeds,
    seed_mean_sd,
    seeds_text,
    test_notes,
    training_seeds,
    value,
    where,
)

READER = "readers/r_d5.py"
M1_COLUMN = (("qwen_mistill", "m1_p2c_mistill"), ("qwen_vanilla_bf16", "m1_p2c_bf16_vanilla"),
             ("qwen_vanilla_fp32", "m1_p2c_fp32_vanilla"))


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params`: s.d. over seeds with two or more training seeds,
    the seed-0 values when seed 0 is trained, the comparisons when both rows are named."""
    labels, seeds = arm_labels(params), training_seeds(params)
    out = []
    for family in ("qwen", "smollm"):
        for name in ("mistill", "vanilla_bf16"):
            if f"{family}_{name}" in labels:
                out += [f"{family}_{name}_microf1", f"{family}_{name}_microf1_seeds", f"{family}_{name}_valid_rate"]
                out += [f"{family}_{name}_{what}" for what in GENERATION_BEHAVIOUR]
                out += [f"{family}_{name}_microf1_sd"] if len(seeds) >= 2 else []
        if f"{family}_mistill" in labels:
            if 0 in seeds:
                out += [f"{family}_mistill_seed0_microf1", f"{family}_mistill_seed0_m1_p1_p2_p2c",
                        f"{family}_mistill_completed_precision_recall"]
        if {f"{family}_mistill", f"{family}_vanilla_bf16"} <= set(labels):
            out.append(f"{family}_mistill_vs_bf16_vanilla_per_note")
            if family == "qwen":
                out += ["task_note_pairs_mistill_vs_bf16", "m1_p2c_note_pairs_mistill_higher",
                        "m1_p2c_pooled_mean_diff_vs_bf16", "m1_p1_pooled_mean_diff_vs_bf16"]
            else:
                out += ["smollm_task_pairs_vs_bf16", "smollm_m1_p2c_mean_diff_vs_bf16"]
    return out + [key for row, key in M1_COLUMN if row in labels]


def seed_pairs(arm: dict[int, ArmSeed], reference: dict[int, ArmSeed]) -> list[tuple[ArmSeed, ArmSeed]]:
    """Seed-matched pairs (the same training seed in both arms)."""
    return [(arm[s], reference[s]) for s in sorted(set(arm) & set(reference))]


def pooled_task_pairs(pairs, notes) -> dict:
    """Note-pairs pooled over seed pairs: counts of Mistill higher / lower / tied per-note F1."""
    diffs = np.concatenate([np.subtract(per_note_f1(a, notes), per_note_f1(b, notes)) for a, b in pairs])
    return {"higher": int((diffs > 0).sum()), "lower": int((diffs < 0).sum()), "ties": int((diffs == 0).sum()),
            "n": int(diffs.size)}


def pooled_m1_pairs(pairs, kind: str) -> dict | None:
    """Note-pairs pooled over seed pairs on the per-note M1 share at `kind` events (notes both arms score)."""
    diffs = []
    for a, b in pairs:
        sa = a.m1.get(kind, {}).get("per_note_share") or {}
        sb = b.m1.get(kind, {}).get("per_note_share") or {}
        diffs += [sa[n] - sb[n] for n in sorted(set(sa) & set(sb))]
    if not diffs:
        return None
    d = np.asarray(diffs)
    return {"mean": float(d.mean()), "higher": int((d > 0).sum()), "lower": int((d < 0).sum()),
            "ties": int((d == 0).sum()), "n": int(d.size)}


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    from mistill.stats import StatsParams, paired_comparison

    arms = load_arms(params)
    notes = test_notes(params)
    stats = StatsParams.from_params(params)
    v: dict = {}
    inputs: list[Path] = []
    for seeds in arms.values():
        for arm in seeds.values():
            inputs += arm.files()
    for family in ("qwen", "smollm"):
        mistill, vanilla = arms.get(f"{family}_mistill"), arms.get(f"{family}_vanilla_bf16")
        for seeds, name in ((mistill, "mistill"), (vanilla, "vanilla_bf16")):
            if not seeds:
                continue
            mean, sd, per_seed = seed_mean_sd(seeds, "micro_f1")
            v[f"{family}_{name}_microf1"] = value(mean, f"corpus micro-F1, mean over {seeds_text(seeds)}, "
                                                  f"{len(notes)} test notes", where(seeds))
            v[f"{family}_{name}_microf1_seeds"] = value(per_seed, f"corpus micro-F1 per seed, {seeds_text(seeds)}",
                                                        where(seeds))
            v[f"{family}_{name}_valid_rate"] = value(seed_mean_sd(seeds, "valid_rate")[0],
                                                     f"share of generations valid, mean over {seeds_text(seeds)}",
                                                     where(seeds))
            v.update(generation_behaviour(seeds, f"{family}_{name}"))
            if sd is not None:
                v[f"{family}_{name}_microf1_sd"] = value(sd, f"s.d. over {seeds_text(seeds)}", where(seeds))
        if mistill:
            if 0 in mistill:
                arm = mistill[0]
                v[f"{family}_mistill_seed0_microf1"] = value(arm.task["micro_f1"], "corpus micro-F1, seed 0", arm.path)
                shares = m1_shares(arm)
                if shares is not None:
                    v[f"{family}_mistill_seed0_m1_p1_p2_p2c"] = value(shares, m1_text(arm) + ", seed 0",
                                                                      arm.path / "m1.json")
                try:
                    v[f"{family}_mistill_completed_precision_recall"] = value(
                        completed_precision_recall(arm, notes),
                        "corpus precision, recall over the valid generations, seed 0", arm.path / "generations.jsonl")
                except UserError as err:
                    print(f"{READER}: {family} completed precision/recall left out: {err}", file=sys.stderr)
        if not (mistill and vanilla):
            continue
        art = f"{where(mistill)} vs {where(vanilla)}"
        c = paired_comparison(per_note_mean_over_seeds(mistill, notes), per_note_mean_over_seeds(vanilla, notes),
                              n_resamples=stats.bootstrap_resamples, seed=stats.bootstrap_seed,
                              confidence=stats.confidence)
        v[f"{family}_mistill_vs_bf16_vanilla_per_note"] = value(
            c.mean_difference.estimate,
            paired_text(c, f"Mistill ({seeds_text(mistill)}) minus bf16 Vanilla CoT-KD ({seeds_text(vanilla)})"), art)
        pairs = seed_pairs(mistill, vanilla)
        if not pairs:
            continue
        pair_text = f"{len(pairs)} seed pair{'s' if len(pairs) != 1 else ''} (seeds {[a.seed for a, _ in pairs]})"
        task = pooled_task_pairs(pairs, notes)
        key = "task_note_pairs_mistill_vs_bf16" if family == "qwen" else "smollm_task_pairs_vs_bf16"
        v[key] = value(task["higher"], f"note-pairs with higher per-note F1 for Mistill, pooled over {pair_text}: "
                       f"{task['higher']} higher, {task['lower']} lower, {task['ties']} ties of {task['n']} "
                       "(descriptive)", art)
        p2c = pooled_m1_pairs(pairs, "P2C")
        if p2c is not None:
            what = (f"per-note M1 share at P2C events, Mistill minus bf16 Vanilla, pooled over {pair_text}: "
                    f"{p2c['higher']} higher, {p2c['lower']} lower, {p2c['ties']} ties of {p2c['n']} note-pairs")
            if family == "qwen":
                v["m1_p2c_note_pairs_mistill_higher"] = value(p2c["higher"], what + " (count higher; descriptive)",
                                                              art)
                v["m1_p2c_pooled_mean_diff_vs_bf16"] = value(p2c["mean"], "mean of the " + what, art)
            else:
                v["smollm_m1_p2c_mean_diff_vs_bf16"] = value(p2c["mean"], "mean of the " + what, art)
        p1 = pooled_m1_pairs(pairs, "P1") if family == "qwen" else None
        if p1 is not None:
            v["m1_p1_pooled_mean_diff_vs_bf16"] = value(
                p1["mean"], f"mean of the per-note M1 share difference at P1 events, pooled over {pair_text} "
                f"({p1['higher']} higher, {p1['lower']} lower of {p1['n']} note-pairs)", art)
    # Table 2's M1 column on Qwen3-4B: P2C share, mean over seeds
    for row, key in M1_COLUMN:
        seeds = arms.get(row) or {}
        shares = [m1_shares(a, ("P2C",)) for a in seeds.values()]
        shares = [s[0] for s in shares if s is not None]
        if shares:
            v[key] = value(float(np.mean(shares)), f"M1 at P2C (share of the teacher's P2C events with student "
                           f"margin > 0, test notes), mean over {seeds_text(seeds)}", where(seeds))
    return v, inputs


if __name__ == "__main__":
    raise SystemExit(main_for("R-D5", READER, compute_values, keys))
