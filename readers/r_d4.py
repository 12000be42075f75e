"""R-D4 (Table 2, App. L.2): the single-seed logit baselines against fp32 Vanilla CoT-KD: DistiLLM-2 (off-policy,
Qwen3-4B), OPD (on-policy, Qwen3-4B) and GOLD (cross-tokenizer on-policy, SmolLM3-3B).

Reads each arm's evaluations `<artifacts>/DT-eval/student-<label>-<arm>-<precision>-s<seed>/` for the runs
params `baselines.<arm>.runs` names (an arm the profile does not define writes nothing), beside fp32 Vanilla
CoT-KD's (params evaluate.own_heads.arms).  Each row gives Table 2's cells (`mistill.evaluate.readout.row_cells`)
and its paired per-note micro-F1 difference from fp32 Vanilla CoT-KD with the bootstrap interval.
"""

from __future__ import annotations

from pathlib import Path

from mistill.evaluate.readout import (
    FAMILIES,
    arm_labels,
    baseline_seeds,
    eval_root,
    load_arm,
    load_baseline,
    main_for,
    minus_reference,
    row_cell_keys,
    row_cells,
    test_notes,
)

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


def keys(params: dict) -> list[str]:
    labels, out = arm_labels(params), []
    for arm, student, seeds in _rows(params):
        prefix, minus, _ = ROWS[arm]
        out += row_cell_keys(prefix, len(seeds))
        if f"{FAMILIES[student]}_vanilla_fp32" in labels:
            out += [minus, f"{minus}_interval"]
    return out


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    from mistill.stats import StatsParams

    notes, labels = test_notes(params), arm_labels(params)
    stats = StatsParams.from_params(params)
    v: dict = {}
    inputs: list[Path] = []
    for arm, student, _ in _rows(params):
        prefix, minus, what = ROWS[arm]
        seeds = load_baseline(params, arm, student)
        if not seeds:
            continue
        inputs += [p for run in seeds.values() for p in run.files()]
        v.update(row_cells(prefix, seeds, notes))
        reference_label = labels.get(f"{FAMILIES[student]}_vanilla_fp32")
        reference = load_arm(eval_root(params), reference_label) if reference_label else {}
        if reference:
            inputs += [p for run in reference.values() for p in run.files()]
            v.update(minus_reference(minus, seeds, reference, notes, stats, what))
    return v, inputs


if __name__ == "__main__":
    raise SystemExit(main_for("R-D4", READER, compute_values, keys))
