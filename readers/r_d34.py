"""R-D34 (App. N.4-N.5, Table 55): the evidence-flip test, causal half.

From EF-keymask's answers (`mistill evaluate ef-keymask`; `mistill.evaluate.evidence_flip.causal`) on the
accepted cases: per nominated head set (params evidence_flip.causal.sets) and case, D under the clean HF
path and under the sham and target decode-time key masks; Delta D = D_clean - D_masked; target minus sham
(the mean over cases of D_sham - D_target, case bootstrap); the interaction L = G_sham - G_target with
G = D_Mistill - D_Vanilla on the students' own top-k; the same on the sensitivity subset (cases whose
target mask is non-empty on both sides and as long as its sham); the execution-path offset of each
checkpoint, D under the behavioural half's path minus D under the clean HF path (zero by construction
where both paths are the transformers sampler, as under the demo).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.evaluate.evidence_flip.behaviour import detectable_effect, readings
from mistill.evaluate.evidence_flip.commands import FlipSettings, accepted_cases, primary_arm
from mistill.instrument.readout import run_reader, value
from mistill.io import read_json, read_jsonl
from mistill.stats import StatsParams, bootstrap_mean

READER = "readers/r_d34.py"
CONTRASTS = {"teacher_named": "target_minus_sham_teacher_named_pair", "teacher_top": "target_minus_sham_teacher_top40",
             "mistill": "target_minus_sham_mistill", "vanilla": "target_minus_sham_vanilla"}


def keys(params: dict) -> list[str]:
    out = []
    for key in CONTRASTS.values():
        out += [key, f"{key}_interval", f"{key}_29_cases"]
    return [*out, "interaction_l", "interaction_l_interval", "interaction_l_29_cases", "interaction_l_29_cases_interval",
            "teacher_execution_path_offset", "teacher_execution_path_offset_interval", "teacher_d_hf_path",
            "student_offsets", "interaction_sd_and_detectable", "per_arm_detectable_range",
            "mistill_sham_target_d_drop", "sensitivity_cases", *(f"{name}_delta_d" for name in CONTRASTS)]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    settings = FlipSettings.from_params(params)
    section = params["evidence_flip"]
    causal = section["causal"]
    stats = StatsParams.from_params(params)
    cases = accepted_cases(settings)
    pairs = {c["case"]: (c["code"], c["partner"]) for c in cases}
    conditions = tuple(causal.get("conditions") or ("original", "flipped"))
    hf = settings.out_dir / "hf"
    inputs: list[Path] = [settings.cases_dir / "cohort_row.json"]
    d: dict[str, dict[str, dict[str, float]]] = {}     # set -> mask -> case -> D
    complete: set[str] = set(pairs)
    for name, spec in (causal.get("sets") or {}).items():
        d[name] = {}
        for mask in ("clean", "sham", "target"):
            source = name if mask != "clean" or spec.get("clean", True) else "teacher_named"
            path = hf / source / mask / "generations.jsonl"
            if path.exists():
                by_case = readings([r for r in read_jsonl(path) if r["case"] in pairs], pairs, conditions)
                d[name][mask] = {c: r.d for c, r in by_case.items()}
                inputs.append(path)
    # the sensitivity subset, from the teacher's masks (every set masks the same texts' evidence)
    masks_path = hf / "teacher_named" / "masks.json"
    if masks_path.exists():
        lengths = read_json(masks_path, "key masks")["keys"]
        for case in pairs:
            sides = [lengths.get(f"{case}:{c}") for c in ("original", "flipped")]
            if any(s is None or s["target"] == 0 or s["target"] != s["sham"] for s in sides):
                complete.discard(case)
    art = f"{hf}/*/*/generations.jsonl"

    def interval(values):
        return bootstrap_mean(values, n_resamples=stats.bootstrap_resamples, seed=stats.bootstrap_seed,
                              confidence=stats.confidence)

    v: dict[str, dict] = {"sensitivity_cases": value(len(complete), "count of cases whose target masks are non-empty "
                                                     "and match their sham", art)}
    contrast_sd = {}
    for name, key in CONTRASTS.items():
        got = d.get(name, {})
        if not {"sham", "target", "clean"} <= set(got):
            continue
        common = sorted(set(got["sham"]) & set(got["target"]) & set(got["clean"]))
        diff = [got["sham"][c] - got["target"][c] for c in common]
        if len(diff) < 2:
            continue
        est = interval(diff)
        v[key] = value(est.estimate, f"Delta D target minus sham, mean over {len(diff)} cases", art)
        v[f"{key}_interval"] = value([est.low, est.high], f"{stats.confidence:.0%} percentile bootstrap over cases", art)
        sub = [got["sham"][c] - got["target"][c] for c in common if c in complete]
        if sub:
            v[f"{key}_29_cases"] = value(float(np.mean(sub)), f"the same over the {len(sub)} sensitivity cases", art)
        contrast_sd[name] = detectable_effect(diff)
        clean = float(np.mean([got["clean"][c] for c in common]))
        v[f"{name}_delta_d"] = value([clean, clean - float(np.mean([got["sham"][c] for c in common])),
                                      clean - float(np.mean([got["target"][c] for c in common]))],
                                     f"[D clean, Delta D sham, Delta D target], mean over {len(common)} cases", art)
    if contrast_sd:
        v["per_arm_detectable_range"] = value([min(contrast_sd.values()), max(contrast_sd.values())],
                                              "smallest and largest approx. detectable effect of the contrasts", art)
    m, va = d.get("mistill", {}), d.get("vanilla", {})
    if {"sham", "target"} <= set(m) and {"sham", "target"} <= set(va):
        common = sorted(set(m["sham"]) & set(m["target"]) & set(va["sham"]) & set(va["target"]))
        per_case = [(m["sham"][c] - va["sham"][c]) - (m["target"][c] - va["target"][c]) for c in common]
        if len(per_case) > 1:
            est = interval(per_case)
            v["interaction_l"] = value(est.estimate, f"G sham minus G target over {len(per_case)} cases", art)
            v["interaction_l_interval"] = value([est.low, est.high], f"{stats.confidence:.0%} percentile bootstrap "
                                                "over cases", art)
            v["interaction_sd_and_detectable"] = value([float(np.std(per_case, ddof=1)), detectable_effect(per_case)],
                                                       "SD, approx. detectable L", art)
            sub = [x for c, x in zip(common, per_case) if c in complete]
            if len(sub) > 1:
                sub_est = interval(sub)
                v["interaction_l_29_cases"] = value(sub_est.estimate, f"over the {len(sub)} sensitivity cases", art)
                v["interaction_l_29_cases_interval"] = value([sub_est.low, sub_est.high], f"{stats.confidence:.0%} "
                                                             "percentile bootstrap over cases", art)
        if "clean" in m:
            v["mistill_sham_target_d_drop"] = value(
                [float(np.mean([m["clean"][c] - m["sham"][c] for c in m["sham"] if c in m["clean"]])),
                 float(np.mean([m["clean"][c] - m["target"][c] for c in m["target"] if c in m["clean"]]))],
                "Delta D [sham, target], mean over cases", art)
    # the execution path: D of the behavioural half's answers minus D of the clean HF answers, per case
    offsets = {}
    behaviour_labels = {"teacher_named": "teacher", "mistill": primary_arm(params, "mistill", 0),
                        "vanilla": primary_arm(params, "vanilla", 0)}
    for name, label in behaviour_labels.items():
        path = settings.out_dir / "gen" / label / "generations.jsonl"
        clean = d.get(name, {}).get("clean")
        if not path.exists() or not clean:
            continue
        behaviour = readings([r for r in read_jsonl(path) if r["case"] in pairs], pairs)
        offsets[name] = [behaviour[c].d - clean[c] for c in sorted(clean) if c in behaviour]
        inputs.append(path)
    if offsets.get("teacher_named"):
        est = interval(offsets["teacher_named"])
        v["teacher_execution_path_offset"] = value(est.estimate, "D, generation path minus HF path, mean over cases",
                                                   art)
        v["teacher_execution_path_offset_interval"] = value([est.low, est.high], f"{stats.confidence:.0%} "
                                                            "percentile bootstrap over cases", art)
        v["teacher_d_hf_path"] = value(float(np.mean(list(d["teacher_named"]["clean"].values()))),
                                       "D, clean HF path", art)
    if offsets.get("mistill") and offsets.get("vanilla"):
        v["student_offsets"] = value([float(np.mean(offsets["mistill"])), float(np.mean(offsets["vanilla"]))],
                                     "D offsets, generation path minus HF path: [Mistill, Vanilla CoT-KD]", art)
    return {k: x for k, x in v.items() if np.all(np.isfinite(np.asarray(x["value"], dtype=float)))}, inputs


def main() -> int:
    return run_reader("R-D34", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
