"""R-D6 (Sec. 4.4, Table 3, App. K Table 45): own-heads knock-in recovery of each arm's re-ranked heads,
beside the random floors and the teacher, and Mistill against Vanilla CoT-KD seed-matched and note-clustered.

Reads the own-heads chain's M6/<arm>-s<seed>/ artifacts (arm labels: params evaluate.own_heads.arms)
and the teacher's shortlist knock-in (evaluate.own_heads.teacher_faithfulness); writes the registry's
R-D6 keys that the artifacts present can give through mistill.repro.numbers.write_numbers.  Keys
keep the paper's names (k40, random40); under a profile with fewer heads the set sizes are the
profile's (evaluate.own_heads.bins, teacher_k) and each value's statistic says which k it is.

Besides the paper's keys, every arm row writes its own per-seed cells of Table 3, whatever the profile's
seeds: `<row>_own_<phase>_seeds` (median over test notes of the own top-k knock-in recovery, per seed),
`<row>_m2_lift_p2c_seeds` and `<row>_prefix_share_p2c_seeds` (the own top read-side heads at P2C, per seed),
the mean over seeds of the three P2C cells (`<row>_own_p2c_seed_mean`, ...), and the teacher's HD-002 row
at P1 and P2.  The table reads the paper's seed-grid results (R-D12, R-D15,
R-D27) where they exist and these cells otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.evaluate.compare import arm_values, clustered, seed_dirs, seed_medians
from mistill.evaluate.own_heads import OwnHeadsConfig
from mistill.evaluate.readout import main_for
from mistill.io import read_json
from mistill.stats import StatsParams

READER = "readers/r_d6.py"


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params` (the rows evaluate.own_heads.arms names)."""
    labels = set((params["evaluate"]["own_heads"].get("arms") or {}))
    out = ["own_all_heads_knockin_minus_clean_max_abs", "teacher_hd002_p2c_k40"]
    for family in ("qwen", "smollm"):
        if f"{family}_untrained" in labels:
            out += [f"untrained_{family}_own_p2c_k40", f"{family}_untrained_random40_floors_p1_p2c"]
    if "smollm_untrained" in labels:
        out.append("smollm_random40_floor_p2c")
    if "qwen_untrained" in labels:
        out.append("untrained_qwen_share_of_teacher")
    for family in ("qwen", "smollm"):
        for tag in ("fp32", "bf16"):
            if {f"{family}_mistill", f"{family}_vanilla_{tag}"} <= labels:
                out += [f"{family}_mistill_minus_{tag}_vanilla_p2c", f"{family}_mistill_minus_{tag}_vanilla_p2"]
    if {"qwen_mistill", "qwen_vanilla_bf16"} <= labels:
        out += ["qwen_mistill_vs_bf16_p2c_sign_p", "qwen_mistill_minus_bf16_vanilla_p2_lower_notes"]
    if {"qwen_mistill", "qwen_vanilla_fp32"} <= labels:
        out += ["qwen_m2_mistill_minus_fp32_vanilla_p2c", "qwen_m2_mistill_minus_fp32_vanilla_p1"]
    out += ["smollm_bf16_vanilla_own_p2c"] if "smollm_vanilla_bf16" in labels else []
    out += ["smollm_fp32_vanilla_own_p2c_seeds"] if "smollm_vanilla_fp32" in labels else []
    out += ["teacher_hd002_p1_k40", "teacher_hd002_p2_k40"]
    return out + [key for row in params["evaluate"]["own_heads"].get("arms") or {} for key in row_keys(row)]


PHASES = ("P1", "P2", "P2C")


def row_keys(row: str) -> list[str]:
    """The per-seed Table 3 cells of one arm row (params evaluate.own_heads.arms)."""
    per_seed = [*(f"{row}_own_{phase.lower()}_seeds" for phase in PHASES),
                f"{row}_m2_lift_p2c_seeds", f"{row}_prefix_share_p2c_seeds"]
    return per_seed + [f"{row}_{cell}_p2c_seed_mean" for cell in ("own", "m2_lift", "prefix_share")]


def _value(v, statistic: str, artifact) -> dict:
    return {"value": v, "statistic": statistic, "artifact": str(artifact)}


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    """(values by registry key, input paths) from whatever arms' artifacts exist."""
    cfg = OwnHeadsConfig.from_params(params)
    section = params["evaluate"]["own_heads"]
    stats = StatsParams.from_params(params)
    labels = dict(section.get("arms") or {})
    k = max(cfg.bins)
    root = Path(cfg.artifacts)
    present = {}
    for row, label in labels.items():
        try:
            present[row] = (label, seed_dirs(root, label))
        except UserError:
            continue
    inputs = [d for _, dirs in present.values() for d in dirs.values()]
    v: dict = {}

    def m4(row: str, phase: str, set_kind: str = "top") -> dict[int, dict[str, float]]:
        return arm_values(root, present[row][0], "m4", phase=phase, k=k, set_kind=set_kind, min_range=cfg.min_range)

    def m2(row: str, phase: str) -> dict[int, dict[str, float]]:
        return arm_values(root, present[row][0], "m2", phase=phase)

    def where(row: str) -> str:
        return f"{root}/M6/{present[row][0]}-s*"

    median_stat = f"median over test notes of per-note mean recovery (own top-{k}, 1-nat gate); mean over seeds"
    floor_stat = f"median over test notes, count-matched random-{k} sets redrawn per note; [P1, P2C]"
    for family, row in (("qwen", "qwen_untrained"), ("smollm", "smollm_untrained")):
        if row not in present:
            continue
        own = seed_medians(m4(row, "P2C"))["mean_of_seed_medians"]
        if own is not None:
            v[f"untrained_{family}_own_p2c_k40"] = _value(own, median_stat, where(row))
        floors = [seed_medians(m4(row, p, "random"))["mean_of_seed_medians"] for p in ("P1", "P2C")]
        if all(f is not None for f in floors):
            v[f"{family}_untrained_random40_floors_p1_p2c"] = _value(floors, floor_stat, where(row))
            if family == "smollm":
                v["smollm_random40_floor_p2c"] = _value(floors[1], floor_stat.replace("; [P1, P2C]", ", P2C"),
                                                        where(row))

    # the invariant behind every cell (App. C, K): knocking in all of an arm's heads restores its clean margin
    gaps = [phase["all_heads_minus_clean_max_abs"] for d in inputs
            for phase in json.loads((d / "faithfulness2.json").read_text()).get("phases", {}).values()
            if phase.get("all_heads_minus_clean_max_abs") is not None]
    if gaps:
        v["own_all_heads_knockin_minus_clean_max_abs"] = _value(
            max(gaps), "nats, max |all-heads knock-in margin - clean margin| over arms, seeds, phases and events",
            f"{root}/M6/*")

    teacher_path = Path(section.get("teacher_faithfulness", ""))
    if teacher_path.is_file():
        tk = str(section.get("teacher_k"))
        phases = json.loads(teacher_path.read_text()).get("phases", {})
        inputs.append(teacher_path)
        for phase in PHASES:
            cell = phases.get(phase, {}).get("bins", {}).get(tk, {})
            teacher = cell.get("knockin", {}).get("top", {}).get("median")
            if teacher is not None:
                v[f"teacher_hd002_{phase.lower()}_k40"] = _value(
                    teacher, f"median over notes, teacher global top-{tk} ({phase})", teacher_path)
        teacher = v.get("teacher_hd002_p2c_k40", {}).get("value")
        if "untrained_qwen_own_p2c_k40" in v and teacher:
            v["untrained_qwen_share_of_teacher"] = _value(
                100.0 * v["untrained_qwen_own_p2c_k40"]["value"] / teacher,
                "percent: untrained own top-k P2C recovery over the teacher's", teacher_path)

    diff_stat = ("note-clustered mean over notes of the per-note mean seed-matched difference "
                 f"(own top-{k} recovery; bootstrap {stats.bootstrap_resamples}, seed {stats.bootstrap_seed})")
    for family, ref_row, tag in (("qwen", "qwen_vanilla_fp32", "fp32"), ("qwen", "qwen_vanilla_bf16", "bf16"),
                                 ("smollm", "smollm_vanilla_fp32", "fp32"), ("smollm", "smollm_vanilla_bf16", "bf16")):
        arm_row = f"{family}_mistill"
        if arm_row not in present or ref_row not in present:
            continue
        art = f"{where(arm_row)} vs {where(ref_row)}"
        for phase in ("P2C", "P2"):
            key = f"{family}_mistill_minus_{tag}_vanilla_{phase.lower()}"
            c = clustered(m4(arm_row, phase), m4(ref_row, phase), stats)
            if c is None:
                continue
            v[key] = _value(c["mean_difference"], f"{diff_stat}; {c['notes_higher']} higher / "
                            f"{c['notes_lower']} lower of {c['n_notes']}, sign p {c['sign_p']:.3g}", art)
            if key == "qwen_mistill_minus_bf16_vanilla_p2c":
                v["qwen_mistill_vs_bf16_p2c_sign_p"] = _value(
                    c["sign_p"], f"two-sided sign test over notes (Wilcoxon p {c['wilcoxon_p']:.3g})", art)
            if key == "qwen_mistill_minus_bf16_vanilla_p2":
                v["qwen_mistill_minus_bf16_vanilla_p2_lower_notes"] = _value(
                    c["notes_lower"], f"count of {c['n_notes']} notes where Mistill is lower", art)
        if family == "qwen" and tag == "fp32":
            for phase in ("P2C", "P1"):
                c = clustered(m2(arm_row, phase), m2(ref_row, phase), stats)
                if c is not None:
                    v[f"qwen_m2_mistill_minus_fp32_vanilla_{phase.lower()}"] = _value(
                        c["mean_difference"], f"M2 region lift of the own top-{cfg.readside_k}, note-clustered "
                        f"mean difference; {c['notes_higher']} higher / {c['notes_lower']} lower", art)
    for row, key in (("smollm_vanilla_bf16", "smollm_bf16_vanilla_own_p2c"),):
        if row in present:
            med = seed_medians(m4(row, "P2C"))["mean_of_seed_medians"]
            if med is not None:
                v[key] = _value(med, median_stat, where(row))
    if "smollm_vanilla_fp32" in present:
        per_seed = seed_medians(m4("smollm_vanilla_fp32", "P2C"))["per_seed_median"]
        if per_seed:
            v["smollm_fp32_vanilla_own_p2c_seeds"] = _value(
                [per_seed[s] for s in sorted(per_seed)], f"per-seed medians over notes, seeds {sorted(per_seed)}",
                where("smollm_vanilla_fp32"))
    for row in present:
        v.update(_row_cells(row, root, present[row][0], cfg, k))
    return v, inputs


def _row_cells(row: str, root: Path, label: str, cfg: OwnHeadsConfig, k: int) -> dict:
    """One arm row's per-seed Table 3 cells (keys `row_keys(row)`), for the seeds its artifacts hold."""
    out = {}
    where = f"{root}/M6/{label}-s*"
    for phase in PHASES:
        per_seed = seed_medians(arm_values(root, label, "m4", phase=phase, k=k, min_range=cfg.min_range))
        medians = per_seed["per_seed_median"]
        if medians:
            out[f"{row}_own_{phase.lower()}_seeds"] = _value(
                [medians[s] for s in sorted(medians)],
                f"per-seed medians over test notes of per-note mean recovery (own top-{k}, {phase}), "
                f"seeds {sorted(medians)}", where)
    readside = {seed: read_json(d / "readside.json", "read-side summary")["phases"].get("P2C", {}).get("top", {})
                for seed, d in seed_dirs(root, label).items() if (d / "readside.json").exists()}
    for field, key, what in (("lift", "m2_lift", "M2 region lift"),
                             ("share_prefix", "prefix_share", "emitted-prefix share of attention")):
        cells = {seed: panel.get(field) for seed, panel in readside.items() if panel.get(field) is not None}
        if cells:
            out[f"{row}_{key}_p2c_seeds"] = _value(
                [cells[s] for s in sorted(cells)],
                f"{what} of the own top-{cfg.readside_k} P2C heads, per seed, seeds {sorted(cells)}", where)
    for cell in ("own", "m2_lift", "prefix_share"):
        seeds = out.get(f"{row}_{cell}_p2c_seeds")
        if seeds:
            out[f"{row}_{cell}_p2c_seed_mean"] = _value(float(np.mean(seeds["value"])),
                                                        f"mean over seeds of: {seeds['statistic']}", where)
    return out


if __name__ == "__main__":
    raise SystemExit(main_for("R-D6", READER, compute_values, keys))
