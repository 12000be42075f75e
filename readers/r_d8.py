"""R-D8 (Sec. 4.3, Figure 8, App. M.5, Table 53): the learning curve.

Mistill and bf16 Vanilla CoT-KD trained on two smaller nested subsets of the training notes (the paper's 100 and
250 of 493; recipe variants `mistilln100`, `vanillan100`, `mistilln250`, `vanillan250`, params variants.arms,
switch `n_train`, seed 0) beside the main runs on the whole training set (every note params distill.n_train
leaves, the paper's 493; Mistill and bf16 Vanilla CoT-KD at every seed of distill.seeds, fp32 Vanilla CoT-KD the
precision-mixed point).

Read at each size: corpus micro-F1 of both arms; the paired task comparison as notes on which Mistill's per-note
F1 is higher and lower with the exact sign test (at the full size the note-pairs of every seed pair pooled and
counted as if independent: descriptive, as the paper says); and Mistill's lead in M1 at P2C (the share of the
teacher's contrastive events where the student's margin favours the teacher's code), Mistill minus Vanilla
CoT-KD (at the full size the mean over seeds of each arm).  Each size is read off the runs' own configs (the
notes they trained on), not from params.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from mistill.errors import UserError
from mistill.evaluate.readout import (
    ArmSeed,
    load_arms,
    main_for,
    per_note_f1,
    run_inputs,
    test_notes,
    value,
    where,
)
from mistill.evaluate.variants import VariantReadout
from mistill.io import read_json
from mistill.stats import sign_test

READER = "readers/r_d8.py"
SIZES = ("n100", "n250")   # the paper's names of the two smaller sizes; each names a Mistill and a Vanilla variant


def keys(params: dict) -> list[str]:
    return ["n100_mistill_vs_vanilla_notes", "n250_mistill_vs_vanilla_notes", "n493_mistill_vs_bf16_vanilla_note_pairs",
            "n493_fp32_vanilla_seed0_microf1", "m1_p2c_lead_n100_n250_n493", "m1_p2c_lead_vs_fp32_vanilla_n493",
            # registry extra_keys
            "training_sizes", "microf1_mistill_by_size", "microf1_vanilla_bf16_by_size", "m1_p2c_mistill_by_size",
            "m1_p2c_vanilla_bf16_by_size", "notes_higher_by_size", "notes_lower_by_size", "sign_p_by_size",
            "n493_mistill_seed0_microf1"]


def trained_notes(config: Path) -> int:
    """How many notes a run trained on: its config's example ids."""
    if not config.is_file():
        raise UserError(f"{config}: no training run config; train the run first")
    return len(read_json(config, "training run config")["example_ids"])


def smaller_size(params: dict, size: str) -> tuple[VariantReadout, VariantReadout]:
    """The Mistill and bf16 Vanilla CoT-KD variants of one smaller size, checked to differ by the objective alone."""
    mistill = VariantReadout(f"mistill{size}", params, others=(f"vanilla{size}",))
    vanilla = VariantReadout(f"vanilla{size}", params)
    m, v = mistill.entry, vanilla.entry
    if (m.get("arm", "mistill"), v.get("arm")) != ("mistill", "vanilla") or m.get("n_train") is None or any(
            m.get(s) != v.get(s) for s in ("student", "seed", "precision", "n_train")):
        raise UserError(f"params variants.arms mistill{size}, vanilla{size}: the learning curve pairs Mistill and "
                        f"Vanilla CoT-KD (arm: vanilla) on one student, seed, precision and n_train; found {m} and {v}")
    if v["precision"] != "bf16":
        raise UserError(f"params variants.arms.vanilla{size}: the curve compares bf16 weights (App. M.5)")
    return mistill, vanilla


def paired(mistill: dict[int, ArmSeed], vanilla: dict[int, ArmSeed], notes) -> tuple[list[float], str]:
    """Per-note F1 differences, Mistill minus Vanilla CoT-KD, of every seed pair the two share, pooled."""
    seeds = sorted(set(mistill) & set(vanilla))
    if not seeds:
        raise UserError(f"{where(mistill)} and {where(vanilla)}: no seed in common")
    diffs = [a - b for s in seeds for a, b in zip(per_note_f1(mistill[s], notes), per_note_f1(vanilla[s], notes))]
    return diffs, ", ".join(map(str, seeds))


def m1_p2c(runs: dict[int, ArmSeed]) -> float:
    shares = [r.m1.get("P2C", {}).get("p_margin_positive") for r in runs.values()]
    if None in shares:
        raise UserError(f"{where(runs)}: no M1 at P2C in m1.json")
    return statistics.fmean(float(s) for s in shares)


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    arms = load_arms(params)
    notes = test_notes(params)
    inputs: list[Path] = [Path(params["evaluate"]["test_notes"])]
    v: dict[str, dict] = {}
    sizes, f1_m, f1_v, m1_m, m1_v, signs, m1_lead, where_sizes = [], [], [], [], [], [], [], []

    def record(size: int, mistill: dict[int, ArmSeed], vanilla: dict[int, ArmSeed]) -> tuple[list[float], str]:
        sizes.append(size)
        f1_m.append(statistics.fmean(float(r.task["micro_f1"]) for r in mistill.values()))
        f1_v.append(statistics.fmean(float(r.task["micro_f1"]) for r in vanilla.values()))
        m1_m.append(m1_p2c(mistill))
        m1_v.append(m1_p2c(vanilla))
        m1_lead.append(m1_m[-1] - m1_v[-1])
        diffs, seeds = paired(mistill, vanilla, notes)
        test = sign_test(diffs)
        signs.append([test.n_positive, test.n_negative, test.p_value])
        inputs.extend(run_inputs(mistill) + run_inputs(vanilla))
        return diffs, seeds

    for size in SIZES:
        mistill, vanilla = smaller_size(params, size)
        n = trained_notes(mistill.run_config_path)
        if trained_notes(vanilla.run_config_path) != n:
            raise UserError(f"{vanilla.run_config_path}: trained on other notes than {mistill.run_config_path}")
        inputs += [mistill.run_config_path, vanilla.run_config_path]
        m_run, v_run = mistill.evaluation("variant"), mistill.evaluation(f"vanilla{size}")
        record(n, {mistill.seed: m_run}, {mistill.seed: v_run})
        where_sizes.append(str(m_run.path.parent / f"*{size}-*-s{mistill.seed}"))
        h, lo, p = signs[-1]
        v[f"{size}_mistill_vs_vanilla_notes"] = value(
            h, f"test notes on which Mistill's per-note F1 is higher than bf16 Vanilla CoT-KD's, both trained on "
            f"{n} notes (seed {mistill.seed}); {lo} lower, {len(notes) - h - lo} tied, exact sign test p {p:.3g}",
            f"{m_run.path} vs {v_run.path}")
        inputs += mistill.inputs

    mistill, bf16, fp32 = arms["qwen_mistill"], arms["qwen_vanilla_bf16"], arms["qwen_vanilla_fp32"]
    full_config = Path(params["distill"]["runs_dir"]) / "DT-001" / f"{mistill[min(mistill)].label}-s{min(mistill)}" / "config.json"
    full = trained_notes(full_config)
    inputs.append(full_config)
    if full <= sizes[-1]:
        raise UserError(f"params variants.arms: the curve's sizes {sizes} must lie below the main runs' {full} notes")
    _, seeds = record(full, mistill, bf16)
    h, lo, p = signs[-1]
    v["n493_mistill_vs_bf16_vanilla_note_pairs"] = value(
        h, f"note-pairs on which Mistill's per-note F1 is higher than bf16 Vanilla CoT-KD's, pooled over seed pairs "
        f"{seeds} on all {full} training notes and counted as if independent (descriptive); {lo} lower, exact sign "
        f"test p {p:.3g}", f"{where(mistill)} vs {where(bf16)}")
    seed0 = min(fp32)
    v["n493_fp32_vanilla_seed0_microf1"] = value(float(fp32[seed0].task["micro_f1"]), f"corpus micro-F1 on the test "
                                                 f"notes, fp32 Vanilla CoT-KD on all {full} notes, seed {seed0}",
                                                 f"{fp32[seed0].path}/task.json")
    v["n493_mistill_seed0_microf1"] = value(float(mistill[seed0].task["micro_f1"]), f"corpus micro-F1 on the test "
                                            f"notes, Mistill on all {full} notes, seed {seed0}",
                                            f"{mistill[seed0].path}/task.json")
    inputs += run_inputs(fp32)
    arts = ", ".join([*where_sizes, where(mistill), where(bf16)])
    v["m1_p2c_lead_n100_n250_n493"] = value(m1_lead, f"M1 at P2C, Mistill minus bf16 Vanilla CoT-KD, at {sizes} "
                                            f"training notes (the full size: each arm's mean over seeds {seeds})", arts)
    v["m1_p2c_lead_vs_fp32_vanilla_n493"] = value(m1_m[-1] - m1_p2c(fp32), f"M1 at P2C, Mistill minus fp32 Vanilla "
                                                  f"CoT-KD on all {full} notes, each arm's mean over seeds",
                                                  f"{where(mistill)} vs {where(fp32)}")
    v["training_sizes"] = value(sizes, "training notes of each point of the curve (the runs' configs)", arts)
    for key, values, what in (("microf1_mistill_by_size", f1_m, "corpus micro-F1, Mistill"),
                              ("microf1_vanilla_bf16_by_size", f1_v, "corpus micro-F1, bf16 Vanilla CoT-KD"),
                              ("m1_p2c_mistill_by_size", m1_m, "M1 at P2C, Mistill"),
                              ("m1_p2c_vanilla_bf16_by_size", m1_v, "M1 at P2C, bf16 Vanilla CoT-KD")):
        v[key] = value(values, f"{what} at each size (the full size: mean over seeds {seeds})", arts)
    pairs = ("per-note F1 against bf16 Vanilla CoT-KD at each size (the full size: note-pairs pooled over seed pairs, "
             "descriptive)")
    for i, (key, what) in enumerate((("notes_higher_by_size", "notes on which Mistill is higher"),
                                     ("notes_lower_by_size", "notes on which Mistill is lower"),
                                     ("sign_p_by_size", "exact sign test p"))):
        v[key] = value([s[i] for s in signs], f"{what}, {pairs}", arts)
    return v, sorted(set(inputs))


def main() -> int:
    return main_for("R-D8", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
