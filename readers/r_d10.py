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
  `mistill evaluate arm --m1-null`: untrained, Vanilla CoT-KD, Mistill), its range over the arm runs.
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
            # registry extra_keys
            "selected_val_microf1", "tied_lambdas", "grid_lambdas", "grid_val_microf1", "grid_m1_p2c",
            "grid_cap_percent", "selected_vs_vanilla_task_interval",
            "selected_vs_vanilla_m1_p2c_interval", "selected_vs_vanilla_m1_p1_interval",
            "selected_vs_vanilla_m1_p2_interval"]


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
    roles = {ref["role"]: label for label, ref in (selection.get("references") or {}).items()}
    refs = {role: read_arm(Path(selection["dir"]) / "reference" / label, label, int(entry["seed"]))
            for role, label in roles.items()}
    inputs = [chosen_path, Path(selection["notes"])] + [p for arm in (*cells.values(), *refs.values()) for p in arm.files()]
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


def main() -> int:
    return main_for("R-D10", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
