"""R-D3 (Table 2, App. J.3, L.7): Feature-KD, the generic attention and representation control, against fp32
Vanilla CoT-KD on the task, and on its own heads.

Reads the Feature-KD runs' evaluations `<baselines.dir>/DT-eval/student-<label>-featurekd-<precision>-s<seed>/`
(runs: params baselines.featurekd.runs) beside fp32 Vanilla CoT-KD's (params evaluate.own_heads.arms), and
their own-heads chains `<baselines.dir>/M6/...` (stage M6-featurekd).  Task values are means over the seeds
present (LAS is App. K's simulatability gain, Hase et al.'s leakage-adjusted LAS a key beside it, beyond the
paper); the comparison with fp32 Vanilla CoT-KD averages each note's F1 over seeds first and reports the
bootstrap mean difference with its interval (`mistill.evaluate.readout.minus_reference`).  On the own heads:
the median over notes of SmolLM3-3B Feature-KD's own top-k P2C knock-in recovery, and Qwen3-4B's seed-0
fp32 Vanilla CoT-KD minus seed-0 Feature-KD per note, note-clustered (App. L.7).
"""

from __future__ import annotations

from pathlib import Path

from mistill.errors import UserError
from mistill.evaluate.compare import arm_values, clustered, seed_dirs, seed_medians
from mistill.evaluate.own_heads import OwnHeadsConfig
from mistill.evaluate.readout import (
    FAMILIES,
    arm_labels,
    baseline_label,
    baseline_seeds,
    fp32_reference,
    load_baseline,
    main_for,
    minus_reference,
    row_cell_keys,
    row_cells,
    run_inputs,
    simulatability_gain_minus_reference,
    test_notes,
    value,
)

READER = "readers/r_d3.py"
ARM = "featurekd"


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params`: one Table 2 row per student Feature-KD trains, its
    difference from fp32 Vanilla CoT-KD, and the own-heads cells."""
    labels, out = arm_labels(params), []
    for student, seeds in baseline_seeds(params, ARM).items():
        family = FAMILIES[student]
        out += row_cell_keys(f"{family}_{ARM}", len(seeds)) + [f"{family}_{ARM}_own_p2c_k40"]
        if f"{family}_vanilla_fp32" in labels:
            out += [f"{family}_{ARM}_minus_fp32_vanilla", f"{family}_{ARM}_minus_fp32_vanilla_interval",
                    f"{family}_{ARM}_las_minus_fp32_vanilla"]
            if 0 in seeds:
                out.append(f"{family}_vanilla_s0_minus_{ARM}_own_p2c")
    return out


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    from mistill.stats import StatsParams

    notes, labels = test_notes(params), arm_labels(params)
    stats = StatsParams.from_params(params)
    cfg = OwnHeadsConfig.from_params(params)
    k, root = max(cfg.bins), Path(cfg.artifacts)
    v: dict = {}
    inputs: list[Path] = []
    for student in baseline_seeds(params, ARM):
        family = FAMILIES[student]
        prefix = f"{family}_{ARM}"
        seeds = load_baseline(params, ARM, student)
        if not seeds:
            continue
        inputs += run_inputs(seeds)
        v.update(row_cells(prefix, seeds, notes))
        reference_label = labels.get(f"{family}_vanilla_fp32")
        reference = fp32_reference(params, student)
        if reference:
            inputs += run_inputs(reference)
            v.update(minus_reference(f"{prefix}_minus_fp32_vanilla", seeds, reference, notes, stats,
                                     "Feature-KD minus fp32 Vanilla CoT-KD"))
            v.update(simulatability_gain_minus_reference(f"{prefix}_las_minus_fp32_vanilla", seeds, reference, notes,
                                                         stats, "Feature-KD minus fp32 Vanilla CoT-KD"))
        # own heads (stage M6-featurekd, under params baselines.dir)
        label, own_root = baseline_label(params, ARM, student), Path(params["baselines"]["dir"])
        try:
            dirs = seed_dirs(own_root, label)
        except UserError:   # no own-heads chain for this row yet: the task cells stand alone
            continue
        inputs += list(dirs.values())
        own = arm_values(own_root, label, "m4", phase="P2C", k=k, min_range=cfg.min_range)
        median = seed_medians(own)["mean_of_seed_medians"]
        if median is not None:
            v[f"{prefix}_own_p2c_k40"] = value(
                median, f"median over test notes of per-note mean recovery (own top-{k}, P2C, 1-nat gate); mean "
                f"over seeds", f"{own_root}/M6/{label}-s*")
        if reference_label and 0 in own:
            try:
                vanilla = arm_values(root, reference_label, "m4", phase="P2C", k=k, min_range=cfg.min_range)
            except UserError:   # the reference's own-heads chain is not built
                vanilla = {}
            if 0 in vanilla:
                c = clustered({0: vanilla[0]}, {0: own[0]}, stats)
                if c is not None:
                    v[f"{family}_vanilla_s0_minus_{ARM}_own_p2c"] = value(
                        c["mean_difference"], f"mean over notes of the per-note seed-0 difference, fp32 Vanilla "
                        f"CoT-KD minus Feature-KD (own top-{k} P2C recovery); {c['notes_higher']} higher / "
                        f"{c['notes_lower']} lower of {c['n_notes']}, sign p {c['sign_p']:.3g}",
                        f"{root}/M6/{reference_label}-s0 vs {own_root}/M6/{label}-s0")
    return v, inputs


if __name__ == "__main__":
    raise SystemExit(main_for("R-D3", READER, compute_values, keys))
