"""R-D28 (App. E, Table 22): the trace edits on the students, Mistill against Vanilla CoT-KD per trained pair.

Reads the own-heads chain's edits (`mistill.evaluate.edit_effects`: per arm, seed and note the mean over
the note's events of the mean effect over the replacements, on the events every seed of both arms of a
comparison carries).  Treated
minus control is seed-matched and clustered by note (`mistill.stats.note_clustered_comparison`): the
mean over notes with its bootstrap interval, notes higher and lower.  The fp32 pairs set Mistill with fp32 master
weights, recipe variants of params variants.arms, against fp32 Vanilla CoT-KD: at the λ transferred from bf16
(R-D17's runs, every seed) and at the λ selected for fp32 (R-D22's pick, seed 0: the paper's one seed).  The
mediated share of the arm's
own top-2 contrastive heads (mean-ablated at the decision during both reads): the median over events
with a neutral (filler) effect above read_side.edits.mediation_min_effect of 1 - effect under
ablation / effect.  Arm labels: params evaluate.own_heads.arms.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.distill.runs import FP32_MISTILL_VARIANTS, variant, variant_label
from mistill.errors import UserError
from mistill.evaluate.compare import clustered
from mistill.evaluate.edit_effects import arm_edit_dirs, load_rows, per_note_effect, shared_events
from mistill.evaluate.matched import FAMILIES
from mistill.evaluate.own_heads import OwnHeadsConfig, edits_dir
from mistill.instrument.read_passes import ReadSide
from mistill.instrument.readout import run_reader, value
from mistill.stats import StatsParams

READER = "readers/r_d28.py"
# paper key -> (treated row, control row) of evaluate.own_heads.arms
PAIRS = {"bf16_qwen_pair_edit_diff": ("qwen_mistill", "qwen_vanilla_bf16"),
         "smollm_pair_edit_diff": ("smollm_mistill", "smollm_vanilla_bf16"),
         "smollm_pair_edit_diff_second_reference": ("smollm_mistill", "smollm_vanilla_fp32")}
# paper key -> the recipe variants of the treated fp32 Mistill arm, against the qwen_vanilla_fp32 row
FP32_PAIRS = {"fp32_pair_lambda01_edit_diff": FP32_MISTILL_VARIANTS,          # the λ transferred from bf16
              "fp32_pair_lambda001_edit_diff": FAMILIES["fp32"][:1]}        # the λ selected for fp32, seed 0
FP32_CONTROL = "qwen_vanilla_fp32"


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params` (the rows evaluate.own_heads.arms names)."""
    rows = set(params["evaluate"]["own_heads"].get("arms") or {})
    out = []
    for key, pair in PAIRS.items():
        if set(pair) <= rows:
            out += [key, f"{key}_interval", f"{key}_notes_higher_lower"]
    if FP32_CONTROL in rows:
        out += [k for key in FP32_PAIRS for k in (key, f"{key}_interval", f"{key}_notes_higher_lower")]
    out += ["student_top2_mediated_share_mistill_s0"] if "qwen_mistill" in rows else []
    out += [f"{row}_edit_effect" for row in params["evaluate"]["own_heads"].get("arms") or {}]
    return out


def mediated_share(rows_by_note: dict[str, list[dict]], min_effect: float) -> tuple[float | None, int]:
    ratios = []
    for rows in rows_by_note.values():
        for r in rows:
            if r["margin"]["filler"] is None or r["margin_ablated"]["filler"] is None:
                continue
            effect = r["margin_identity"] - r["margin"]["filler"]
            if effect > min_effect:
                ratios.append(1.0 - (r["margin_identity_ablated"] - r["margin_ablated"]["filler"]) / effect)
    return (float(np.median(ratios)) if ratios else None), len(ratios)


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    cfg = OwnHeadsConfig.from_params(params)
    stats = StatsParams.from_params(params)
    min_effect = ReadSide.from_params(params).edits.mediation_min_effect
    labels = dict(params["evaluate"]["own_heads"].get("arms") or {})
    root = Path(cfg.artifacts)
    runs: dict[str, dict[int, dict[str, list[dict]]]] = {}
    inputs: list[Path] = []
    for row, label in labels.items():
        try:
            dirs = arm_edit_dirs(root, label)
        except UserError:
            continue
        runs[row] = {seed: load_rows(d) for seed, d in dirs.items()}
        inputs += [d / "prefix_edit.json" for d in dirs.values()]
    if not runs:
        raise UserError(f"{root}: no arm has the own-heads edits (M6-edits/<arm>-s<seed>/prefix_edit.json)")
    art = f"{root}/M6-edits/*/prefix_edit.jsonl"
    v: dict[str, dict] = {}
    for row, by_seed in runs.items():
        shared = shared_events(list(by_seed.values()))
        per_seed = [list(per_note_effect(r, shared).values()) for r in by_seed.values()]
        if all(per_seed):      # every seed has a note with a read event
            v[f"{row}_edit_effect"] = value([float(np.mean(x)) for x in per_seed], "nats, per seed the mean over "
                                            "notes of the per-note mean effect over the three replacements", art)
    def compare(key: str, treated: dict[int, dict], control: dict[int, dict], who: str, where: str) -> None:
        shared = shared_events([*treated.values(), *control.values()])
        result = clustered({s: per_note_effect(r, shared) for s, r in treated.items()},
                           {s: per_note_effect(r, shared) for s, r in control.items()}, stats)
        if result is None:
            return
        pairs = len(result["seed_pairs"])
        v[key] = value(result["mean_difference"], f"nats per note, {who}, {pairs} seed pair(s), mean over "
                       f"{result['n_notes']} notes", where)
        v[f"{key}_interval"] = value([result["ci_low"], result["ci_high"]],
                                     f"{result['confidence']:.0%} percentile bootstrap over notes", where)
        v[f"{key}_notes_higher_lower"] = value([result["notes_higher"], result["notes_lower"]],
                                               f"notes higher and lower of {result['n_notes']} (sign test p "
                                               f"{result['sign_p']:.3g})", where)

    for key, (treated, control) in PAIRS.items():
        if treated in runs and control in runs:
            compare(key, runs[treated], runs[control], f"{labels[treated]} minus {labels[control]}", art)
    if FP32_CONTROL in runs:
        variants = params.get("variants") or {}
        for key, names in FP32_PAIRS.items():
            treated = {}
            for name in names:
                entry = variant(variants, name)
                path = edits_dir(variants["dir"], variant_label(name, entry), int(entry["seed"]))
                if not (path / "prefix_edit.json").is_file():
                    raise UserError(f"{path}: no trace edits of recipe variant {name}; run "
                                    "`dvc repro pipelines/own-heads/dvc.yaml:M6-variant-edits`")
                treated[int(entry["seed"])] = load_rows(path)
                inputs.append(path / "prefix_edit.json")
            control = {s: r for s, r in runs[FP32_CONTROL].items() if s in treated}
            compare(key, treated, control, f"fp32 Mistill ({', '.join(names)}) minus {labels[FP32_CONTROL]}, "
                    "seed-matched", f"{variants['dir']}/M6-edits/*/prefix_edit.jsonl vs {art}")
    if "qwen_mistill" in runs and 0 in runs["qwen_mistill"]:
        share, n = mediated_share(runs["qwen_mistill"][0], min_effect)
        if share is not None:
            v["student_top2_mediated_share_mistill_s0"] = value(
                share, f"median over {n} events with a neutral effect above {min_effect} nats", art)
    return v, inputs


def main() -> int:
    return run_reader("R-D28", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
