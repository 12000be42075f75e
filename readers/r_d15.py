"""R-D15 (Sec. 4.4, App. K "Readouts that do not discriminate"): M4 at P1, M3 and M5 on the students' own heads.

Reads the own-heads chain (M6/<arm>-s<seed>/, arm labels params evaluate.own_heads.arms), the students'
evaluations (DT-eval/), the teacher's shortlist knock-in and prose locus (HD-002, HD-002-locus) and the
forcing probe on three Qwen student arms (stage M5, params student_locus):

* M4 at P1: the untrained students' own top-k knock-in recovery at the chapter decision (median over
  test notes, mean over seeds; k the largest of evaluate.own_heads.bins, the paper's 40), and the
  teacher's global top-k on HD-002 (evaluate.own_heads.teacher_k);
* M5: the median distance in tokens from the locus to the chapter letter of each M5 arm's
  window-decided mentions (and its window share), against the teacher's on HD-002;
* M3, the near-miss loop-back: the own top-k P2C heads' share of attention on the earlier mentions of
  the near-miss (readside.json, median over notes), for the SmolLM3 arms and as the range over every
  Qwen arm and seed read; the top loop-back head of each Qwen arm-seed (the own top-k P2C head with the
  largest median share on the near-miss) and how many arm-seeds share the most frequent one (the
  paper's L24H21, top in 17 of 23);
* SmolLM3's micro-F1 untrained and after fp32 Vanilla CoT-KD, seed 0 (what M3 moves against).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.evaluate.compare import arm_values, seed_dirs, seed_medians
from mistill.evaluate.own_heads import OwnHeadsConfig
from mistill.evaluate.readout import eval_root, load_arm, main_for, value
from mistill.instrument.readside import panel_note_values
from mistill.io import read_json, read_jsonl
from mistill.locus.passes import LocusSettings
from mistill.locus.readout import LocusRun

READER = "readers/r_d15.py"


def keys(params: dict) -> list[str]:
    return ["untrained_qwen_own_p1_k40", "untrained_smollm_own_p1_k40", "m5_locus_distance_untrained_vanilla_mistill",
            "m5_locus_distance_teacher", "smollm_m3_untrained", "smollm_m3_mistill", "teacher_own_p1_k40",
            "qwen_m3_range_23_arms", "l24h21_top_loopback_arms", "smollm_m3_vanilla_s0",
            "smollm_microf1_untrained_to_vanilla",
            # registry extra_keys
            "m5_window_share_untrained_vanilla_mistill", "qwen_m3_arms_read"]


def student_locus(params: dict) -> tuple[Path, int, dict[str, dict]]:
    section = params.get("student_locus")
    if not isinstance(section, dict) or not section.get("arms"):
        raise UserError("params.yaml: the active profile has no `student_locus` section naming the M5 arms")
    return Path(section["out_dir"]), int(section.get("seed", 0)), dict(section["arms"])


def near_miss_share(m6_dir: Path) -> float:
    """M3: the own top-k P2C heads' median share (over notes) of attention on the near-miss's earlier mentions."""
    share = read_json(m6_dir / "readside.json", "read-side summary")["phases"].get("P2C", {}).get("top", {}).get("share_N")
    if share is None:
        raise UserError(f"{m6_dir}/readside.json: no P2C near-miss share (no contrastive event with an earlier mention)")
    return float(share)


def top_loopback_head(m6_dir: Path) -> str:
    """The own top-k P2C head with the largest median (over notes) share of attention on the near-miss."""
    body = read_json(m6_dir / "readside.json", "read-side summary")
    heads = body["panels"]["P2C"]["top"]
    n_heads = read_json(m6_dir.parent.parent / "HD-S" / m6_dir.name / "head_sets_contrast.json",
                        "own head sets")["n_heads"]
    rows = {p.parent.name: read_jsonl(p) for p in sorted(m6_dir.glob("*/readside.jsonl"))}
    medians = []
    for head in heads:
        shares = [panel_note_values(r, "P2C", [head])["share_N"] for r in rows.values()]
        shares = [x for x in shares if np.isfinite(x)]
        medians.append(float(np.median(shares)) if shares else -np.inf)
    best = heads[int(np.argmax(medians))]
    return f"l{best // n_heads}h{best % n_heads}"


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    cfg = OwnHeadsConfig.from_params(params)
    section = params["evaluate"]["own_heads"]
    labels = dict(section.get("arms") or {})
    root, k = Path(cfg.artifacts), max(cfg.bins)
    v: dict = {}
    inputs: list[Path] = []

    def seeds(row: str) -> dict[int, Path]:
        if row not in labels:
            raise UserError(f"params.yaml evaluate.own_heads.arms: no row {row!r}")
        found = seed_dirs(root, labels[row])
        inputs.extend(found.values())
        return found

    for family in ("qwen", "smollm"):
        row = f"{family}_untrained"
        seeds(row)
        own = seed_medians(arm_values(root, labels[row], "m4", phase="P1", k=k, min_range=cfg.min_range))
        v[f"untrained_{family}_own_p1_k40"] = value(
            own["mean_of_seed_medians"], f"median over test notes of per-note mean recovery (own top-{k}, P1, 1-nat "
            "gate); mean over seeds", f"{root}/M6/{labels[row]}-s*")
    teacher_path = Path(section["teacher_faithfulness"])
    tk = str(section["teacher_k"])
    cell = read_json(teacher_path, "teacher knock-in")["phases"].get("P1", {}).get("bins", {}).get(tk, {})
    if "knockin" not in cell:
        raise UserError(f"{teacher_path}: no P1 knock-in at k={tk} (params evaluate.own_heads.teacher_k)")
    v["teacher_own_p1_k40"] = value(cell["knockin"]["top"]["median"],
                                    f"median over notes, teacher global top-{tk} (P1), HD-002", teacher_path)
    inputs.append(teacher_path)

    # M5: the forcing probe on the students against the teacher's on the shortlist traces
    m5_dir, m5_seed, m5_arms = student_locus(params)
    runs = [LocusRun.load(m5_dir / f"{arm['label']}-s{m5_seed}", ablations=False) for arm in m5_arms.values()]
    teacher_locus = LocusRun.load(LocusSettings.from_params(params).shortlist_out_dir, ablations=False)
    names = ", ".join(m5_arms)
    v["m5_locus_distance_untrained_vanilla_mistill"] = value(
        [run.median_distance() for run in runs], f"tokens, median locus distance of the window-decided chapter "
        f"mentions ({names}; seed {m5_seed})", f"{m5_dir}/*/*/locus.json")
    v["m5_window_share_untrained_vanilla_mistill"] = value(
        [100.0 * run.outcome_share("window") for run in runs], f"percent of probed chapter mentions decided in the "
        f"window ({names})", f"{m5_dir}/*/*/locus.json")
    v["m5_locus_distance_teacher"] = value(teacher_locus.median_distance(), "tokens, median locus distance of the "
                                           "teacher's window-decided chapter mentions, shortlist traces",
                                           f"{teacher_locus.out}/*/locus.json")
    inputs += [p for run in (*runs, teacher_locus) for p in run.loci]

    # M3 on SmolLM3: untrained, fp32 Vanilla seed 0, Mistill (mean over its seeds)
    for key, row, only_seed in (("smollm_m3_untrained", "smollm_untrained", None),
                                ("smollm_m3_vanilla_s0", "smollm_vanilla_fp32", 0),
                                ("smollm_m3_mistill", "smollm_mistill", None)):
        found = seeds(row)
        chosen = {s: d for s, d in found.items() if only_seed is None or s == only_seed}
        if not chosen:
            raise UserError(f"{root}/M6/{labels[row]}-s{only_seed}: not read; run its own-heads chain")
        v[key] = value(float(np.mean([near_miss_share(d) for d in chosen.values()])),
                       f"median over test notes of the own top-{cfg.readside_k} P2C heads' attention share on the "
                       f"near-miss's earlier mentions, mean over seeds {sorted(chosen)}", f"{root}/M6/{labels[row]}-s*")
    # M3 on Qwen3: every arm and seed read, whatever the arm (own-heads labels student-qwen-...)
    qwen = sorted(d for d in (root / "M6").glob(f"{labels['qwen_untrained'].rsplit('-', 1)[0]}-*-s*")
                  if (d / "readside.json").exists())
    if not qwen:
        raise UserError(f"{root}/M6: no Qwen arm's readside.json")
    shares = [near_miss_share(d) for d in qwen]
    tops = Counter(top_loopback_head(d) for d in qwen)
    leader, count = min(tops.items(), key=lambda item: (-item[1], item[0]))
    v["qwen_m3_range_23_arms"] = value([min(shares), max(shares)], f"range over {len(qwen)} Qwen arm-seeds of the own "
                                       f"top-{cfg.readside_k} P2C heads' median share on the near-miss",
                                       f"{root}/M6/*/readside.json")
    v["qwen_m3_arms_read"] = value(len(qwen), "count of Qwen arm-seeds read", f"{root}/M6/*/readside.json")
    v["l24h21_top_loopback_arms"] = value(count, f"count of {len(qwen)} Qwen arm-seeds whose top loop-back head is "
                                          f"{leader}, the most frequent", f"{root}/M6/*/readside.jsonl")
    inputs += [d / "readside.json" for d in qwen]

    # what M3 moves against on SmolLM3: the task
    evals = eval_root(params)
    f1 = []
    for row in ("smollm_untrained", "smollm_vanilla_fp32"):
        arm = load_arm(evals, labels[row]).get(0)
        if arm is None:
            raise UserError(f"{evals}/{labels[row]}-s0: not evaluated; run its evaluation stage")
        f1.append(float(arm.task["micro_f1"]))
        inputs += arm.files()
    v["smollm_microf1_untrained_to_vanilla"] = value(f1, "corpus micro-F1 on the test notes, untrained and fp32 "
                                                     "Vanilla CoT-KD seed 0", f"{evals}/*/task.json")
    return v, inputs


def main() -> int:
    return main_for("R-D15", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
