"""R-D22 (Secs. 4.3, 4.4, App. I.4, Tables 2, 3, 42): the λ selection re-run with fp32 master weights.

The pre-registered rule (`mistill.distill.selection`) on a grid of fp32 Mistill cells (params
selection.grids.fp32: its range around the λ transferred from bf16, the same tie band and outward step), and
Mistill with fp32 master weights trained at the pick (recipe variants `fp32pick`, `fp32pick1`, `fp32pick2`,
`lambda_from: fp32`; `mistill.evaluate.matched.Family`).  Read at seed 0, as the paper's one-seed selection
record: the pick and the validation cells, the test micro-F1, the per-note F1 difference against each fp32
Vanilla CoT-KD seed, and the own top-k recovery at P2C (the largest and smallest k of evaluate.own_heads.bins,
the paper's 40 and 8) against fp32 Vanilla CoT-KD's seeds (note-clustered) and bf16 Mistill seed 0.  Beside it
the transferred-λ arms of R-D17 (`fp32mistill*`) against fp32 and bf16 Vanilla CoT-KD on their own heads,
seed-matched and note-clustered, and two swept cells of the grid beyond the validation notes (params
selection.fp32_swept, stages EV-cell and M6-cell): one on the test notes, one on its own heads.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from mistill.distill.runs import FP32_MISTILL_VARIANTS
from mistill.errors import UserError
from mistill.evaluate.compare import arm_values, clustered, seed_dirs
from mistill.evaluate.matched import Family
from mistill.evaluate.probe import probe_reading
from mistill.evaluate.readout import arm_labels, load_arms, main_for, per_note_f1, test_notes, value, where
from mistill.evaluate.variants import VariantReadout
from mistill.io import read_json

READER = "readers/r_d22.py"
TRANSFERRED = FP32_MISTILL_VARIANTS   # R-D17's runs at the λ selected in bf16


def keys(params: dict) -> list[str]:
    return ["selected_fp32_lambda", "val_microf1_lambda001_vs_003", "test_microf1_seed0_lambda001",
            "own_p2c_k40_lambda001", "own_p2c_k40_lambda001_vs_fp32_vanilla", "own_p2c_k8_lambda001",
            "transferred_lambda_vs_fp32_vanilla_own_p2c", "transferred_lambda_vs_bf16_vanilla_own_p2c",
            "test_microf1_lambda01_seed0", "lambda001_vs_vanilla_seeds_per_note", "lambda001_vs_bf16_mistill_s0_own_p2c",
            "tie_band", "test_microf1_lambda003_seed0", "lambda03_own_p2c", "own_p2c_k8_probe_l35h26_in_rank8",
            "probe_vs_fp32_vanilla", "l35h26_rank_fp32_arm",
            # registry extra_keys
            "own_p2c_k40_lambda001_vs_fp32_vanilla_interval", "val_lambdas_fp32", "val_microf1_cells_fp32",
            "val_m1_p2c_cells_fp32"]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    fp32 = Family("fp32", params)
    if fp32.entry["precision"] != "fp32" or any(r.entry["precision"] != "fp32" for r in fp32.runs.values()):
        raise UserError(f"params selection.grids.{fp32.grid} and variants.arms {', '.join(TRANSFERRED)}: the "
                        f"re-selection trains with fp32 master weights (precision: fp32)")
    seed0 = min(fp32.runs)
    run0 = fp32.runs[seed0]
    k, k8, stats = run0.k, run0.k_small, run0.stats
    notes, arms, labels = test_notes(params), load_arms(params), arm_labels(params)
    root = Path(params["paths"]["artifacts"])
    inputs: list[Path] = [Path(params["evaluate"]["test_notes"])]
    v: dict[str, dict] = {}

    # -- the selection ----------------------------------------------------------------------------------
    cells, lam = fp32.cells, fp32.lam
    picked = next(c for c in cells if math.isclose(c.lam, lam))
    runner = max((c for c in cells if c is not picked), key=lambda c: c.micro_f1)
    grid = f"the fp32 grid (lambdas {[c.lam for c in cells]}, tie band {fp32.entry['band']:g})"
    v["selected_fp32_lambda"] = value(lam, f"lambda_P1 = lambda_P2 picked on {grid}, M1 at P2C among the tied",
                                      fp32.pick_file)
    v["val_microf1_lambda001_vs_003"] = value([picked.micro_f1, runner.micro_f1], f"validation micro-F1 of the pick "
                                              f"and of the best other cell (lambda = {runner.lam:g}) of {grid}",
                                              fp32.pick_file)
    v["tie_band"] = value(float(fp32.entry["band"]), "validation micro-F1 tie band of the fp32 grid", fp32.pick_file)
    for key, field, what in (("val_lambdas_fp32", "lam", "the fp32 grid's lambdas, the outward step included"),
                             ("val_microf1_cells_fp32", "micro_f1", "validation micro-F1 of each cell of the fp32 grid"),
                             ("val_m1_p2c_cells_fp32", "m1_p2c", "validation M1 at P2C of each cell of the fp32 grid")):
        v[key] = value([getattr(c, field) for c in cells], what, fp32.pick_file)

    # -- the pick's seed 0 on the test notes ----------------------------------------------------------------
    what0 = f"fp32 Mistill at the fp32 pick (lambda {lam:g}), seed {seed0}"
    ev0 = run0.evaluation("variant")
    v["test_microf1_seed0_lambda001"] = value(float(ev0.task["micro_f1"]), f"corpus micro-F1 on the test notes, "
                                              f"{what0}", f"{ev0.path}/task.json")
    vanilla = arms["qwen_vanilla_fp32"]
    mine = per_note_f1(ev0, notes)
    v["lambda001_vs_vanilla_seeds_per_note"] = value(
        [statistics.fmean(a - b for a, b in zip(mine, per_note_f1(vanilla[s], notes))) for s in sorted(vanilla)],
        f"mean over test notes of the per-note F1 difference, {what0} minus each fp32 Vanilla CoT-KD seed "
        f"{sorted(vanilla)}", f"{ev0.path} vs {where(vanilla)}")

    def main_arm(row: str, kk: int) -> dict[int, dict[str, float]]:
        values = arm_values(root, labels[row], "m4", phase="P2C", k=kk, min_range=run0.cfg.min_range)
        if not values:
            raise UserError(f"{root}/M6/{labels[row]}-s<seed>: not read; run its own-heads chain")
        inputs.extend(seed_dirs(root, labels[row]).values())
        return values

    own0 = {seed0: run0.notes_of("variant", "P2C", k)}
    for kk, key in ((k, "own_p2c_k40_lambda001"), (k8, "own_p2c_k8_lambda001")):
        v[key] = value(statistics.median(run0.notes_of("variant", "P2C", kk).values()), f"median over test notes of "
                       f"the own top-{kk} P2C recovery, {what0}", run0.where("variant"))
    c = clustered(own0, main_arm("qwen_vanilla_fp32", k), stats)
    v["own_p2c_k40_lambda001_vs_fp32_vanilla"] = value(
        c["mean_difference"], f"mean over notes of the per-note difference, {what0} minus fp32 Vanilla CoT-KD's "
        f"seeds (own top-{k} P2C recovery), note-clustered; {c['notes_higher']} higher / {c['notes_lower']} lower of "
        f"{c['n_notes']}, sign p {c['sign_p']:.3g}, Wilcoxon p {c['wilcoxon_p']:.3g}", run0.where("variant"))
    v["own_p2c_k40_lambda001_vs_fp32_vanilla_interval"] = value(
        [c["ci_low"], c["ci_high"]], f"{c['confidence']:.0%} note-bootstrap interval of that mean difference",
        run0.where("variant"))
    mistill = main_arm("qwen_mistill", k)
    if seed0 not in mistill:
        raise UserError(f"{root}/M6/{labels['qwen_mistill']}-s{seed0}: not read; run its own-heads chain")
    c = clustered(own0, {seed0: mistill[seed0]}, stats)
    v["lambda001_vs_bf16_mistill_s0_own_p2c"] = value(
        c["mean_difference"], f"mean over notes of the per-note difference, {what0} minus bf16 Mistill seed {seed0} "
        f"(own top-{k} P2C recovery); {c['notes_higher']} higher / {c['notes_lower']} lower of {c['n_notes']}",
        run0.where("variant"))

    # -- the post-hoc rank probe on the pick's seed 0 (mistill.evaluate.probe) ------------------------------
    probe, probe_notes, probe_dir = probe_reading(params, run0.name, k8, run0.cfg.min_range)
    moved = f"{probe['head']} (rank {probe['rank_in_arm']} in the arm, ranks {probe['reference_ranks']} in the bf16 " \
            f"Mistill arms) moved into rank {probe['moved_to']}"
    v["own_p2c_k8_probe_l35h26_in_rank8"] = value(statistics.median(probe_notes.values()), f"median over test notes of "
                                                  f"the P2C recovery of the probe's top-{k8}, {what0}: {moved}",
                                                  probe_dir)
    c = clustered({seed0: probe_notes}, main_arm("qwen_vanilla_fp32", k8), stats)
    v["probe_vs_fp32_vanilla"] = value(
        c["mean_difference"], f"mean over notes of the per-note difference, the probe's top-{k8} minus fp32 Vanilla "
        f"CoT-KD's own top-{k8} (its seeds), note-clustered; {c['notes_higher']} higher / {c['notes_lower']} lower of "
        f"{c['n_notes']}, sign p {c['sign_p']:.3g}", probe_dir)
    v["l35h26_rank_fp32_arm"] = value(probe["rank_in_arm"], f"rank of {probe['head']} in the own P2C ranking, "
                                      f"{what0} (the paper's L35H26; the head the probe moves)", probe_dir)
    inputs.append(probe_dir)

    # -- two swept cells beyond the validation notes --------------------------------------------------------
    swept = params["selection"]["fp32_swept"]
    swept_root = Path(swept["out_dir"])
    for role in ("test", "own_heads"):
        if not any(math.isclose(float(swept[role]), c.lam) for c in cells):
            raise UserError(f"params selection.fp32_swept.{role} {swept[role]}: not a cell of {grid}")
    test_lam, own_lam = float(swept["test"]), float(swept["own_heads"])
    task_path = swept_root / "DT-eval" / f"fp32-l{test_lam:g}" / "task.json"
    v["test_microf1_lambda003_seed0"] = value(
        float(read_json(task_path, "task metrics")["metrics"]["micro_f1"]), f"corpus micro-F1 on the test notes, the "
        f"fp32 grid's cell at lambda {test_lam:g} (seed {fp32.entry['seed']})", task_path)
    cell_label = f"fp32-l{own_lam:g}"
    own_cell = arm_values(swept_root, cell_label, "m4", phase="P2C", k=k, min_range=run0.cfg.min_range)
    if int(fp32.entry["seed"]) not in own_cell:
        raise UserError(f"{swept_root}/M6/{cell_label}-s{fp32.entry['seed']}: not read; run "
                        "`dvc repro pipelines/own-heads/dvc.yaml:M6-cell`")
    v["lambda03_own_p2c"] = value(statistics.median(own_cell[int(fp32.entry["seed"])].values()),
                                  f"median over test notes of the own top-{k} P2C recovery, the fp32 grid's cell at "
                                  f"lambda {own_lam:g} (seed {fp32.entry['seed']})",
                                  f"{swept_root}/M6/{cell_label}-s{fp32.entry['seed']}")
    inputs += [task_path, *seed_dirs(swept_root, cell_label).values()]

    # -- the transferred lambda (R-D17's runs) ---------------------------------------------------------------
    transferred = {int(r.seed): r for r in (VariantReadout(name, params) for name in TRANSFERRED)}
    if any({"lambda_p1", "lambda_p2", "lambda_from"} & set(r.entry) or r.entry["precision"] != "fp32"
           for r in transferred.values()):
        raise UserError(f"params variants.arms {', '.join(TRANSFERRED)}: fp32 Mistill at the transferred lambda "
                        f"(precision fp32, no lambda switch)")
    t0 = transferred[min(transferred)]
    t_lam = float(t0.run_config()["arm"]["lambda_p1"])
    t_eval = t0.evaluation("variant")
    v["test_microf1_lambda01_seed0"] = value(float(t_eval.task["micro_f1"]), f"corpus micro-F1 on the test notes, "
                                             f"fp32 Mistill at the transferred lambda {t_lam:g}, seed {t0.seed}",
                                             f"{t_eval.path}/task.json")
    own_t = {s: r.notes_of("variant", "P2C", k) for s, r in transferred.items()}
    where_t = ", ".join(r.where("variant") for r in transferred.values())
    for row, key in (("qwen_vanilla_fp32", "transferred_lambda_vs_fp32_vanilla_own_p2c"),
                     ("qwen_vanilla_bf16", "transferred_lambda_vs_bf16_vanilla_own_p2c")):
        ref = main_arm(row, k)
        c = clustered(own_t, {s: ref[s] for s in own_t if s in ref}, stats)
        v[key] = value(c["mean_difference"], f"mean over notes of the per-note difference, fp32 Mistill at the "
                       f"transferred lambda {t_lam:g} minus {labels[row]} (own top-{k} P2C recovery), seed-matched "
                       f"and note-clustered; {c['notes_higher']} higher / {c['notes_lower']} lower of {c['n_notes']}, "
                       f"sign p {c['sign_p']:.3g}, Wilcoxon p {c['wilcoxon_p']:.3g}", where_t)
    inputs += fp32.inputs + [p for r in transferred.values() for p in r.inputs] + list(ev0.files())
    inputs += [p for s in sorted(vanilla) for p in vanilla[s].files()]
    return v, sorted(set(inputs))


def main() -> int:
    return main_for("R-D22", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
