"""`mistill distill select --grid <name>`: one validation λ selection, the stage DT-select@<name>.

A grid entry (params `selection.grids.<name>`) names the student, seed and precision of its cells, the λs,
the tie band, whether the grid may take its one outward step, and any recipe switch of a variant
(`heads: random` for the RandHeads pool of App. M.2). Each cell is a Mistill run at λ_P1 = λ_P2 = λ,
trained as every run is (`mistill.distill.training_run`) and evaluated through the same command as every
arm (`evaluate arm`), on the validation notes of params `selection` with the teacher's traces and events there.
The rule is `mistill.distill.selection`. Written:

    <selection.dir>/<name>/l<λ>/{run/, generations.jsonl, task.json, fidelity.json, m1.json, cell.json}
    <selection.dir>/<name>/l<λ>/diagnostics.json   the cell's mechanism terms before and after (`diagnose: true`)
    <selection.dir>/picks/<name>.json   the cells, the tied set and the pick: what the Mistill runs read

The picks sit apart from the cells so that the variants' training stages can depend on every pick (an
entry names its grid in `lambda_from`) without depending on the cells' weights.

A killed selection resumes: a finished cell whose readout names its model's weights is not run again.
"""

from __future__ import annotations

from pathlib import Path

from mistill.distill.run_spec import RunSpec
from mistill.distill.runs import switch_options
from mistill.distill.selection import Cell, outward_step, pick, tied
from mistill.distill.selection_grids import GRID_SWITCHES, grid_entry, selection_file
from mistill.distill.training_run import train_run
from mistill.errors import UserError


def cell_spec(params: dict, entry: dict, lam: float, run: Path) -> RunSpec:
    """A cell's Mistill run: the grid's student, seed, precision and switches at λ_P1 = λ_P2 = λ, the λ as the
    cell's directory names it (six significant digits)."""
    lam = float(f"{lam:g}")
    options = {"arm": "mistill", "student": f"student_{entry['student']}", "precision": entry["precision"],
               "seed": int(entry["seed"]), "lambda_p1": lam, "lambda_p2": lam, "out": str(run),
               **switch_options(entry, GRID_SWITCHES)}
    return RunSpec.resolve(params, options)


def run_cell(params: dict, parser, name: str, entry: dict, lam: float, grid_dir: Path, validation: dict) -> Cell:
    """Train and evaluate one cell, or read it back when its readout names the weights on disk.

    The run is always handed to the trainer first: it resumes a killed run, finds a finished one complete, and
    starts again when the recipe, the student or the targets changed (a kept cell of another recipe would
    otherwise stand in the grid); the readout is reused only for the weights it was computed on."""
    from mistill.io import file_sha256, read_json, write_json

    cell_dir = grid_dir / f"l{lam:g}"
    run, readout = cell_dir / "run", cell_dir / "cell.json"
    weights = run / "model" / "model.safetensors"
    spec = cell_spec(params, entry, lam, run)
    train_run(params, spec)
    if entry.get("diagnose"):
        diagnose_cell(params, spec, cell_dir / "diagnostics.json")
    if readout.is_file() and weights.is_file():
        done = read_json(readout, "selection cell")
        if done.get("weights_sha256") == file_sha256(weights):
            return Cell(lam, float(done["micro_f1"]), float(done["m1_p2c"]))
    step = ["evaluate", "arm", "--model", str(run / "model"), "--out-dir", str(cell_dir), "--notes", validation["notes"],
            "--teacher-traces", validation["traces"], "--events-dir", validation["events_dir"],
            "--m1-notes", str(validation["m1_notes"])]   # the arm's evaluation on the validation notes
    step_args = parser.parse_args(step)
    status = step_args.func(step_args)
    if status:
        raise UserError(f"selection cell λ={lam:g} of grid {name}: `mistill {' '.join(step)}` exited {status}")
    cell = Cell(lam, float(read_json(cell_dir / "task.json", "task metrics")["metrics"]["micro_f1"]),
                float(read_json(cell_dir / "m1.json", "M1")["m1"]["P2C"]["p_margin_positive"]))
    write_json(readout, {"lambda": lam, "micro_f1": cell.micro_f1, "m1_p2c": cell.m1_p2c,
                         "weights_sha256": file_sha256(weights)})
    return cell


def diagnose_cell(params: dict, spec: RunSpec, out: Path) -> None:
    """The cell's mechanism terms before and after training (mistill.distill.diagnostics), kept while they name the
    weights on disk."""
    from mistill.distill.diagnostics import diagnose_run
    from mistill.io import file_sha256, read_json, write_json

    weights_sha256 = file_sha256(spec.out / "model" / "model.safetensors")
    if out.is_file() and read_json(out, "mechanism diagnostics").get("weights_sha256") == weights_sha256:
        return
    write_json(out, {**diagnose_run(params, spec), "weights_sha256": weights_sha256})


def cmd_select(args) -> int:
    from mistill.cli import build_parser
    from mistill.io import provenance, write_json
    from mistill.params import load_params

    params = load_params()
    selection = params.get("selection") or {}
    entry = grid_entry(selection, args.grid)
    grid_dir = Path(selection["dir"]) / args.grid
    grid_dir.mkdir(parents=True, exist_ok=True)
    validation = {key: str(selection[key]) for key in ("notes", "traces", "events_dir")}
    # M1 reads the validation notes whose teacher trace has events; the task reads every validation note
    validation["m1_notes"] = grid_dir / "m1_notes.jsonl"
    parser = build_parser("evaluate")   # the evaluation through its command
    notes_args = parser.parse_args(["evaluate", "notes-with-events", "--notes", validation["notes"],
                                    "--events-dir", validation["events_dir"], "--out", str(validation["m1_notes"])])
    notes_args.func(notes_args)

    band = float(entry["band"])
    cells = [run_cell(params, parser, args.grid, entry, lam, grid_dir, validation) for lam in entry["lambdas"]]
    chosen = pick(cells, band)
    step = outward_step(entry["lambdas"], chosen.lam) if entry["extend"] else None
    if step is not None:
        print(f"grid {args.grid}: the pick λ={chosen.lam:g} sits on the edge; one outward step to λ={step:g}")
        cells.append(run_cell(params, parser, args.grid, entry, step, grid_dir, validation))
        chosen = pick(cells, band)
    ties = tied(cells, band)
    write_json(selection_file(selection, args.grid), {
        "grid": args.grid, "entry": {k: v for k, v in entry.items() if k != "lambdas"},
        "lambdas": sorted(c.lam for c in cells), "outward_step": step,
        "cells": [{"lambda": c.lam, "micro_f1": c.micro_f1, "m1_p2c": c.m1_p2c} for c in sorted(cells, key=lambda c: c.lam)],
        "tied": sorted(c.lam for c in ties),
        "selected": {"lambda_p1": chosen.lam, "lambda_p2": chosen.lam},
        "validation": {"notes": validation["notes"], "traces": validation["traces"],
                       "events_dir": validation["events_dir"]},
        "provenance": provenance({"selection": selection}, seed=int(entry["seed"]))})
    print(f"grid {args.grid}: " + ", ".join(f"λ={c.lam:g} F1={c.micro_f1:.4f} M1(P2C)={c.m1_p2c:.3f}"
                                          for c in sorted(cells, key=lambda c: c.lam))
          + f"; tied {[f'{c.lam:g}' for c in ties]} -> λ={chosen.lam:g}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("select", help="the validation λ selection of one grid (App. I.3, I.4, M.2)")
    p.add_argument("--grid", required=True, help="params selection.grids entry")
    p.set_defaults(func=cmd_select)
