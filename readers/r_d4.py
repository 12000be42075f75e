"""R-D4 (Table 2, App. L.2): the single-seed logit baselines against fp32 Vanilla CoT-KD: DistiLLM-2 (off-policy,
Qwen3-4B), OPD (on-policy, Qwen3-4B) and GOLD (cross-tokenizer on-policy, SmolLM3-3B).

Reads each arm's evaluations `<baselines.dir>/DT-eval/student-<label>-<arm>-<precision>-s<seed>/` for the runs
params `baselines.<arm>.runs` names (an arm the profile does not define writes nothing), beside fp32 Vanilla
CoT-KD's (params evaluate.own_heads.arms).  Each row gives Table 2's cells (`mistill.evaluate.readout.row_cells`;
LAS is App. K's simulatability gain, Hase et al.'s leakage-adjusted LAS a key beside it, beyond the paper)
and its paired per-note micro-F1 difference from fp32 Vanilla CoT-KD with the bootstrap interval.  App. L.2's
readings of the on-policy rows: OPD's M1 at P1 and P2C, its tail macro-F1 and its per-note BLEU-4 against bf16
Vanilla CoT-KD and its LAS against both Vanilla CoT-KD rows; GOLD's M1 at P2 (share and median margin) beside seed-0 fp32 Vanilla CoT-KD's, and how many
of GOLD's teacher traces were cut to its rollout cap (the run's `config.json`).
"""

from __future__ import annotations

from pathlib import Path

from mistill.evaluate.readout import (
    FAMILIES,
    ArmSeed,
    arm_labels,
    baseline_seeds,
    eval_root,
    fp32_reference,
    load_arm,
    load_baseline,
    m1_shares,
    m1_text,
    main_for,
    minus_reference,
    row_cell_keys,
    row_cells,
    run_inputs,
    seeds_text,
    simulatability_gain_minus_reference,
    test_notes,
    value,
    where,
)
from mistill.io import read_json

READER = "readers/r_d4.py"
# arm -> (its key prefix, what the difference key is called, what the comparison says)
ROWS = {"distillm2": ("distillm2", "distillm2_minus_fp32_vanilla", "DistiLLM-2 minus fp32 Vanilla CoT-KD"),
        "opd": ("opd", "opd_minus_fp32_vanilla_microf1", "OPD minus fp32 Vanilla CoT-KD"),
        "gold": ("gold", "gold_minus_fp32_vanilla_microf1", "GOLD minus fp32 Vanilla CoT-KD")}


def _rows(params: dict):
    """(arm, student, its seeds) for every arm of ROWS the profile runs."""
    for arm in ROWS:
        for student, seeds in baseline_seeds(params, arm).items():
            yield arm, student, seeds


def _reading_keys(arm: str, labels: dict) -> list[str]:
    """App. L.2's readings of the on-policy rows beyond Table 2's cells."""
    if arm == "opd":
        return ["opd_m1_p1_p2c", "opd_tail_macro_f1"] + (
            ["opd_minus_bf16_vanilla_bleu4", "opd_minus_bf16_vanilla_las"] if "qwen_vanilla_bf16" in labels else []) + (
            ["opd_las_minus_fp32_vanilla"] if "qwen_vanilla_fp32" in labels else [])
    if arm == "gold":
        return ["gold_m1_p1_p2c", "gold_m1_p2", "gold_m1_p2_median_margin", "gold_truncated_training_traces"] + \
            (["smollm_vanilla_s0_m1_p2"] if "smollm_vanilla_fp32" in labels else [])
    return []


def keys(params: dict) -> list[str]:
    labels, out = arm_labels(params), []
    for arm, student, seeds in _rows(params):
        prefix, minus, _ = ROWS[arm]
        out += row_cell_keys(prefix, len(seeds)) + _reading_keys(arm, labels)
        if f"{FAMILIES[student]}_vanilla_fp32" in labels:
            out += [minus, f"{minus}_interval"]
    return out


def _bleu_per_note(seeds: dict[int, ArmSeed], notes) -> list[float]:
    """Each test note's sentence BLEU-4 (fidelity.json per_note), averaged over seeds."""
    per_seed = [read_json(arm.path / "fidelity.json", "fidelity")["per_note"]["bleu4"] for arm in seeds.values()]
    return [sum(s[n.note_id] for s in per_seed) / len(per_seed) for n in notes]


def _opd_readings(seeds: dict[int, ArmSeed], notes, params: dict, stats) -> dict:
    from mistill.stats import paired_comparison

    first, v = seeds[min(seeds)], {}
    shares = m1_shares(first, ("P1", "P2C"))
    if shares is not None:
        v["opd_m1_p1_p2c"] = value(shares, f"{m1_text(first, ('P1', 'P2C'))}, seed {first.seed}", first.path / "m1.json")
    tail = first.task.get("tail_macro_f1")
    if tail is not None and tail == tail:
        v["opd_tail_macro_f1"] = value(tail, f"macro-F1 over tail codes (training-split frequency), seed {first.seed}",
                                       first.path)
    fp32 = arm_labels(params).get("qwen_vanilla_fp32")
    if fp32:
        v.update(simulatability_gain_minus_reference("opd_las_minus_fp32_vanilla", seeds,
                                                     load_arm(eval_root(params), fp32), notes, stats,
                                                     "OPD minus fp32 Vanilla CoT-KD"))
    bf16 = arm_labels(params).get("qwen_vanilla_bf16")
    reference = load_arm(eval_root(params), bf16) if bf16 else {}
    if reference:
        v.update(simulatability_gain_minus_reference("opd_minus_bf16_vanilla_las", seeds, reference, notes, stats,
                                                     "OPD minus bf16 Vanilla CoT-KD"))
    if reference and all((a.path / "fidelity.json").is_file() for a in [*seeds.values(), *reference.values()]):
        c = paired_comparison(_bleu_per_note(seeds, notes), _bleu_per_note(reference, notes),
                              n_resamples=stats.bootstrap_resamples, seed=stats.bootstrap_seed,
                              confidence=stats.confidence)
        iv = c.mean_difference
        v["opd_minus_bf16_vanilla_bleu4"] = value(
            iv.estimate, f"mean over {c.n} test notes of the per-note sentence BLEU-4 difference, OPD minus bf16 "
            f"Vanilla CoT-KD ({seeds_text(reference)}, averaged per note); {iv.confidence:.0%} percentile bootstrap "
            f"[{iv.low:+.4f}, {iv.high:+.4f}]; Wilcoxon p {c.wilcoxon.p_value:.3g}", f"{where(seeds)} vs {where(reference)}")
    return v


def _gold_readings(seeds: dict[int, ArmSeed], params: dict, run_dir: Path) -> dict:
    first, v = seeds[min(seeds)], {}
    shares = m1_shares(first, ("P1", "P2", "P2C"))
    if shares is not None:
        v["gold_m1_p1_p2c"] = value([shares[0], shares[2]], f"{m1_text(first, ('P1', 'P2C'))}, seed {first.seed}",
                                    first.path / "m1.json")
        v["gold_m1_p2"] = value(shares[1], f"{m1_text(first, ('P2',))}, seed {first.seed}", first.path / "m1.json")
        median = first.m1["P2"].get("median_margin")
        if median is not None:
            v["gold_m1_p2_median_margin"] = value(median, "median over the teacher's P2 events of the student's "
                                                  f"margin, nats, seed {first.seed}", first.path / "m1.json")
    vanilla = arm_labels(params).get("smollm_vanilla_fp32")
    reference = load_arm(eval_root(params), vanilla) if vanilla else {}
    if 0 in reference and m1_shares(reference[0], ("P2",)) is not None:
        v["smollm_vanilla_s0_m1_p2"] = value(m1_shares(reference[0], ("P2",))[0],
                                             f"{m1_text(reference[0], ('P2',))}, fp32 Vanilla CoT-KD seed 0",
                                             reference[0].path / "m1.json")
    config = run_dir / "config.json"
    if config.is_file() and "completions_cut" in (run := read_json(config, "run config")):
        v["gold_truncated_training_traces"] = value(
            int(run["completions_cut"]), f"count of the {len(run['example_ids'])} training teacher traces longer than "
            "the rollout cap, truncated to the cap", config)
    return v


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    from mistill.distill.runs import run_dir
    from mistill.stats import StatsParams

    notes = test_notes(params)
    stats = StatsParams.from_params(params)
    v: dict = {}
    inputs: list[Path] = []
    for arm, student, _ in _rows(params):
        prefix, minus, what = ROWS[arm]
        seeds = load_baseline(params, arm, student)
        if not seeds:
            continue
        inputs += run_inputs(seeds)
        v.update(row_cells(prefix, seeds, notes))
        reference = fp32_reference(params, student)
        if reference:
            inputs += run_inputs(reference)
            v.update(minus_reference(minus, seeds, reference, notes, stats, what))
        if arm == "opd":
            v.update(_opd_readings(seeds, notes, params, stats))
        if arm == "gold":
            runs = run_dir(params["baselines"]["dir"], f"student_{student}", arm,
                           params["baselines"][arm]["precision"], min(seeds))
            v.update(_gold_readings(seeds, params, runs))
    return v, inputs


if __name__ == "__main__":
    raise SystemExit(main_for("R-D4", READER, compute_values, keys))
