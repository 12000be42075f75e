"""R-D10 (Sec. 4.1, App. I.3, Tables 39-41): choosing the loss weight on validation notes.

The selection grid params distill.lambda_from names (stage DT-select@<grid>, `mistill.distill.selection`): Mistill
runs at lambda_P1 = lambda_P2 over the grid, one seed, scored on the validation notes of params selection, the pick by the
pre-registered rule (the best validation micro-F1 within the tie band, M1 at P2C among the tied, one outward step
from the grid's edge). Beside it, the reference arms of params selection.references on the same notes
(stage EV-val): the untrained student and Vanilla CoT-KD trained on the cells' training notes. Read:

* the pick, and the range of validation micro-F1 over the pre-registered grid's cells;
* the share of validation generations at the token cap at lambda = 1, for Vanilla CoT-KD and for the untrained student;
* the mechanism terms' loss over the task loss at lambda = 1 and 0.3 (mean over the optimiser steps);
* the pick against Vanilla CoT-KD per validation note: micro-F1, and M1 at P2C, P1 and P2 (note-clustered means
  over the seeds both carry, with bootstrap intervals);
* App. K's NULL control: M1 at the teacher's NULL events in every main arm's test evaluation (the EV stages,
  `mistill evaluate arm --m1-null`: untrained, Vanilla CoT-KD, Mistill), its range over the arm runs;
* the one-seed noise: the SD (ddof 1) of validation micro-F1 over the pick's seeds, the grid's cell at seed 0 and
  the references of role `pick_seed` (the Mistill runs at the pick, seeds 1 and 2);
* App. I.2's removed write term, on the grids params selection.write_term names (the raw and the standardised
  form, `diagnose: true`; mistill.distill.diagnostics): at lambda = 1 the P1 write term's drop over training, the
  student-teacher correlation of c at P1 events before and after, M1 at P1 of the untrained student and of the
  raw cell; the standardised cell's correlation after training, and its micro-F1 on completed answers at 0.1.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from mistill.distill.selection_grids import grid_entry, selection_file
from mistill.errors import UserError
from mistill.evaluate.compare import clustered
from mistill.evaluate.readout import (
    cap_share,
    completed_precision_recall,
    eval_root,
    main_for,
    null_control,
    per_note_f1,
    read_arm,
    value,
)
from mistill.io import read_json, read_jsonl
from mistill.stats import StatsParams
from mistill.world.notes import load_notes

READER = "readers/r_d10.py"
KINDS = {"p2c": "P2C", "p1": "P1", "p2": "P2"}


def keys(params: dict) -> list[str]:
    return ["selected_lambda", "preregistered_grid_val_microf1", "cap_rate_lambda1", "cap_rate_vanilla_100",
            "cap_rate_untrained", "mech_to_task_loss_ratio_lambda1_lambda03", "m1_null_range_all_arms",
            "selected_vs_vanilla_task",
            "selected_vs_vanilla_m1_p2c", "selected_vs_vanilla_m1_p1", "selected_vs_vanilla_m1_p2",
            "one_seed_noise_val_microf1", "write_term_p1_drop", "write_term_c_corr_before_after",
            "write_term_m1_p1_before_after", "standardised_write_term_c_corr", "standardised_write_lambda01_completed_f1",
            # registry extra_keys
            "selected_val_microf1", "tied_lambdas", "grid_lambdas", "grid_val_microf1", "grid_m1_p2c",
            "grid_cap_percent", "selected_vs_vanilla_task_interval",
            "selected_vs_vanilla_m1_p2c_interval", "selected_vs_vanilla_m1_p1_interval",
            "selected_vs_vanilla_m1_p2_interval", "one_seed_val_microf1_seeds", "write_term_p1_before_after",
            "standardised_write_term_p1_drop"]


def cap_percent(arm) -> float:
    return 100.0 * cap_share(arm)


def loss_ratio(run: Path) -> float:
    """Mean over optimiser steps of the mechanism terms' weighted loss (loss - cot) over the task loss (cot)."""
    rows = [r for r in read_jsonl(run / "metrics.jsonl", "training log") if "step" in r]
    if not rows or any(not ({"loss", "cot"} <= set(r)) for r in rows):
        raise UserError(f"{run}/metrics.jsonl: no per-step loss and cot")
    return statistics.fmean((r["loss"] - r["cot"]) / r["cot"] for r in rows)


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    selection, grid = params["selection"], params["distill"]["lambda_from"]
    entry = grid_entry(selection, grid)
    chosen_path = selection_file(selection, grid)
    chosen = read_json(chosen_path, "λ selection")
    grid_dir = Path(selection["dir"]) / grid
    lam = float(chosen["selected"]["lambda_p1"])
    notes = load_notes(selection["notes"])
    stats = StatsParams.from_params(params)
    cells = {float(c["lambda"]): read_arm(grid_dir / f"l{float(c['lambda']):g}", f"{grid}-l{float(c['lambda']):g}",
                                          int(entry["seed"])) for c in chosen["cells"]}
    references = selection.get("references") or {}
    roles = {ref["role"]: label for label, ref in references.items() if ref["role"] != "pick_seed"}
    refs = {role: read_arm(Path(selection["dir"]) / "reference" / label, label, int(entry["seed"]))
            for role, label in roles.items()}
    pick_seeds = {int(ref["seed"]): read_arm(Path(selection["dir"]) / "reference" / label, label, int(ref["seed"]))
                  for label, ref in references.items() if ref["role"] == "pick_seed"}
    inputs = [chosen_path, Path(selection["notes"])] + [p for arm in (*cells.values(), *refs.values(),
                                                                       *pick_seeds.values()) for p in arm.files()]
    rule = (f"grid {grid}: lambda_P1 = lambda_P2 over {entry['lambdas']}, seed {entry['seed']}, {entry['precision']}, "
            f"validation micro-F1 on {len(notes)} notes, tie band {entry['band']}, M1 at P2C among the tied"
            + (f", one outward step to {chosen['outward_step']:g}" if chosen.get("outward_step") else ""))
    v = {"selected_lambda": value(lam, f"lambda_P1 = lambda_P2 picked by the validation rule ({rule})", chosen_path),
         "selected_val_microf1": value(cells[lam].task["micro_f1"], f"validation micro-F1 of the pick, lambda = {lam:g}",
                                       cells[lam].path / "task.json"),
         "tied_lambdas": value(chosen["tied"], f"cells within the tie band of the best ({rule})", chosen_path)}
    order = sorted(cells)
    v["grid_lambdas"] = value(order, f"the cells' lambda_P1 = lambda_P2, the outward step included ({rule})", chosen_path)
    v["grid_val_microf1"] = value([cells[x].task["micro_f1"] for x in order], "validation micro-F1 of each cell, "
                                  "in the order of grid_lambdas", grid_dir)
    v["grid_m1_p2c"] = value([cells[x].m1["P2C"]["p_margin_positive"] for x in order], "M1 at P2C on the validation "
                             "notes with events, each cell, in the order of grid_lambdas", grid_dir)
    v["grid_cap_percent"] = value([cap_percent(cells[x]) for x in order], "percent of validation generations at the "
                                  "token cap, each cell, in the order of grid_lambdas", grid_dir)
    grid_f1 = [cells[x].task["micro_f1"] for x in entry["lambdas"]]
    v["preregistered_grid_val_microf1"] = value(
        [min(grid_f1), max(grid_f1)], f"lowest and highest validation micro-F1 over the pre-registered grid's cells "
        f"(lambda_P1 = lambda_P2 in {entry['lambdas']}; the paper's 3x3 grid also crossed unequal pairs)", grid_dir)

    if 1.0 in cells:
        cap = cap_percent(cells[1.0])
        v["cap_rate_lambda1"] = value([cap, cap], "percent of validation generations at the token cap at lambda = 1, "
                                      "lowest and highest over the grid's cells there (one on the diagonal grid)",
                                      cells[1.0].path / "generations.jsonl")
    for role, key in (("vanilla", "cap_rate_vanilla_100"), ("untrained", "cap_rate_untrained")):
        if role in refs:
            v[key] = value(cap_percent(refs[role]), f"percent of validation generations at the token cap, "
                           f"{refs[role].label}", refs[role].path / "generations.jsonl")
    if {1.0, 0.3} <= set(cells):
        runs = [cells[x].path / "run" for x in (1.0, 0.3)]
        inputs += [r / "metrics.jsonl" for r in runs]
        v["mech_to_task_loss_ratio_lambda1_lambda03"] = value(
            [loss_ratio(r) for r in runs], "mechanism terms' weighted loss over the task (CoT) loss, mean over the "
            "optimiser steps, at lambda = 1 and 0.3 (the attention and interaction terms; the paper's also held the "
            "removed write term)", f"{runs[0]}, {runs[1]}")

    if "vanilla" in refs:
        pick, vanilla, seed = cells[lam], refs["vanilla"], int(entry["seed"])
        art = f"{pick.path} vs {vanilla.path}"
        f1 = {a.label: dict(zip([n.note_id for n in notes], per_note_f1(a, notes))) for a in (pick, vanilla)}
        readouts = {"task": ("per-note F1", f1[pick.label], f1[vanilla.label])}
        for suffix, kind in KINDS.items():
            shares = [a.m1.get(kind, {}).get("per_note_share") for a in (pick, vanilla)]
            if all(shares):
                readouts[f"m1_{suffix}"] = (f"per-note M1 at {kind} (share of the teacher's events with a positive "
                                            "margin)", *shares)
        for suffix, (what, mine, theirs) in readouts.items():
            c = clustered({seed: mine}, {seed: theirs}, stats)
            if c is None or math.isnan(c["mean_difference"]):
                continue
            key = f"selected_vs_vanilla_{suffix}"
            v[key] = value(c["mean_difference"], f"mean over {c['n_notes']} validation notes of the {what} difference, "
                           f"the pick (lambda = {lam:g}) minus {vanilla.label}, seed {seed}; {c['notes_higher']} higher / "
                           f"{c['notes_lower']} lower, sign p {c['sign_p']:.3g}, Wilcoxon p {c['wilcoxon_p']:.3g}", art)
            v[f"{key}_interval"] = value([c["ci_low"], c["ci_high"]], f"{c['confidence']:.0%} note-bootstrap interval "
                                         f"of that mean ({stats.bootstrap_resamples} resamples, seed "
                                         f"{stats.bootstrap_seed})", art)
    if pick_seeds:
        seeds = {int(entry["seed"]): cells[lam], **pick_seeds}
        f1 = [seeds[s].task["micro_f1"] for s in sorted(seeds)]
        v["one_seed_val_microf1_seeds"] = value(f1, f"validation micro-F1 of the pick (lambda = {lam:g}) at seeds "
                                                f"{sorted(seeds)}", grid_dir)
        v["one_seed_noise_val_microf1"] = value(statistics.stdev(f1), f"SD (ddof 1) of validation micro-F1 over the "
                                                f"pick's {len(f1)} seeds: the noise of a one-seed cell", grid_dir)
    write_values, write_inputs = write_term_values(selection, refs.get("untrained"))
    v.update(write_values)
    inputs += write_inputs
    # App. K's NULL control over the arms' test evaluations: M1 where nothing is decided.  The main arms'
    # (untrained, Vanilla CoT-KD, Mistill): the baselines' evaluations live apart, and no result waits on a
    # baseline it does not otherwise read
    null = null_control([eval_root(params)])
    if null:
        v["m1_null_range_all_arms"] = value([min(null.values()), max(null.values())],
                                            f"M1 at NULL events, range over {len(null)} arm runs",
                                            f"{eval_root(params)}/*/m1.json")
        inputs += list(null)
    return v, sorted(set(inputs))


def write_term_values(selection: dict, untrained) -> tuple[dict, list[Path]]:
    """App. I.2's write-term readings from the raw and the standardised grids (params selection.write_term)."""
    grids = selection.get("write_term") or {}
    v, inputs = {}, []
    if not grids:
        return v, inputs
    root = Path(selection["dir"])

    def cell(form: str, lam: float) -> Path:
        entry = grid_entry(selection, grids[form])
        if "write" not in entry.get("terms", ()) or bool(entry.get("write_norm")) != (form == "standardised"):
            raise UserError(f"params selection.write_term.{form}: grid {grids[form]!r} does not train the "
                            f"{form} write term (terms {entry.get('terms')}, write_norm {entry.get('write_norm')})")
        return root / grids[form] / f"l{lam:g}"

    raw = cell("raw", 1.0)
    raw_diag = read_json(raw / "diagnostics.json", "mechanism diagnostics")
    before, after = raw_diag["before"]["P1"], raw_diag["after"]["P1"]
    inputs += [raw / "diagnostics.json", raw / "m1.json"]
    v["write_term_p1_drop"] = value(raw_diag["write_drop_percent"]["P1"], "percent decrease of the P1 write term "
                                    "over training at lambda = (1, 1), mean over the run's training notes before and "
                                    "after", raw / "diagnostics.json")
    v["write_term_p1_before_after"] = value([before["terms"]["write"], after["terms"]["write"]], "the P1 write term "
                                            "before and after training at lambda = (1, 1)", raw / "diagnostics.json")
    if before["c_correlation"] is not None and after["c_correlation"] is not None:
        v["write_term_c_corr_before_after"] = value(
            [before["c_correlation"], after["c_correlation"]], f"Pearson r of the student's and teacher's c over "
            f"{after['events']} P1 events of the training notes, before and after training at lambda = (1, 1)",
            raw / "diagnostics.json")
    if untrained is not None:
        raw_arm = read_arm(raw, f"{grids['raw']}-l1", 0)
        v["write_term_m1_p1_before_after"] = value(
            [untrained.m1["P1"]["p_margin_positive"], raw_arm.m1["P1"]["p_margin_positive"]],
            f"M1 at P1 on the validation notes: the untrained student ({untrained.label}), the raw write-term cell "
            f"at lambda = 1", raw / "m1.json")
    norm = cell("standardised", 1.0)
    norm_diag = read_json(norm / "diagnostics.json", "mechanism diagnostics")
    inputs.append(norm / "diagnostics.json")
    if norm_diag["after"]["P1"]["c_correlation"] is not None:
        v["standardised_write_term_c_corr"] = value(
            norm_diag["after"]["P1"]["c_correlation"], "Pearson r of the student's and teacher's c over the P1 events "
            "of the training notes after training with the standardised write term at lambda = (1, 1)",
            norm / "diagnostics.json")
    v["standardised_write_term_p1_drop"] = value(norm_diag["write_drop_percent"]["P1"], "percent decrease of the "
                                                 "standardised P1 write term over training at lambda = (1, 1)",
                                                 norm / "diagnostics.json")
    low = cell("standardised", 0.1)
    notes = load_notes(selection["notes"])
    inputs += [low / "generations.jsonl", low / "task.json"]
    try:
        precision, recall = completed_precision_recall(read_arm(low, f"{grids['standardised']}-l0.1", 0), notes)
    except UserError as err:   # no completed answer names a code: the key stays unwritten, and the check says so
        print(f"R-D10: standardised_write_lambda01_completed_f1 not written: {err}")
        return v, inputs
    v["standardised_write_lambda01_completed_f1"] = value(
        2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "micro-F1 over the validation notes with a completed answer, the standardised write-term cell at "
        "lambda = 0.1", low / "generations.jsonl")
    return v, inputs


def main() -> int:
    return main_for("R-D10", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
