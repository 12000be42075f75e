"""A λ-selection grid's params entry and its pick file: what the selection stage writes and every run reads.

params `selection.grids.<name>` names a grid's student, seed, precision, λs, tie band, outward step and any recipe
switch of its cells (`mistill.distill.selection_commands` runs it); `<selection.dir>/picks/<name>.json` holds its
cells, tied set and pick, which a Mistill run whose `lambda_from` names the grid reads
(`mistill.distill.run_spec`), as do the readers of R-D10, R-D22 and R-D31.
"""

from __future__ import annotations

from pathlib import Path

from mistill.distill.runs import VARIANT_IDENTITY, VARIANT_SWITCHES
from mistill.distill.selection import Cell, check_grid
from mistill.errors import UserError
from mistill.io import read_json

GRID_RULE = ("lambdas", "band", "extend")
# optional: `diagnose: true` also reads each cell's mechanism terms before and after training
# (mistill.distill.diagnostics; the write-term grids of R-D10)
GRID_OPTIONS = ("diagnose",)
RESERVED = ("picks", "reference")   # directories of selection.dir beside the grids' cells
# what a grid's cells may change besides λ: a variant's switches, less those that set or rescale λ
GRID_SWITCHES = tuple(s for s in VARIANT_SWITCHES if s not in ("arm", "lambda_p1", "lambda_p2", "lambda_from", "dose"))


def grid_entry(selection: dict, name: str) -> dict:
    """params `selection.grids.<name>`, checked."""
    grids = (selection or {}).get("grids") or {}
    if name not in grids:
        raise UserError(f"unknown selection grid {name!r}; params selection.grids names "
                        f"{', '.join(sorted(grids)) or 'none'}")
    if name in RESERVED:
        raise UserError(f"params selection.grids.{name}: {name!r} names a directory of {selection['dir']}; "
                        f"rename the grid")
    entry = dict(grids[name])
    missing = [k for k in (*VARIANT_IDENTITY, *GRID_RULE) if k not in entry]
    unknown = sorted(set(entry) - set(VARIANT_IDENTITY) - set(GRID_RULE) - set(GRID_OPTIONS) - set(GRID_SWITCHES))
    if missing or unknown:
        raise UserError(f"params selection.grids.{name}: "
                        + "; ".join([f"missing {', '.join(missing)}"] * bool(missing)
                                    + [f"unknown keys {', '.join(unknown)} (switches: {', '.join(GRID_SWITCHES)}; options: "
                                       f"{', '.join(GRID_OPTIONS)})"]
                                    * bool(unknown)))
    entry["lambdas"] = check_grid(entry["lambdas"])
    return entry


def selection_file(selection: dict, name: str) -> Path:
    """The pick of grid `name`: what a Mistill run whose params name this grid (distill.lambda_from, a variant's
    lambda_from) reads."""
    return Path(selection["dir"]) / "picks" / f"{name}.json"


def read_selection(selection: dict, name: str) -> dict:
    """The pick file of grid `name` (cells, tied set, pick), as `mistill distill select` wrote it."""
    path = selection_file(selection, name)
    if not path.is_file():
        raise UserError(f"{path}: no λ selection (run `dvc repro pipelines/distill/dvc.yaml:DT-select@{name}`)")
    return read_json(path, "λ selection")


def selected_lambdas(selection: dict, name: str) -> tuple[float, float]:
    chosen = read_selection(selection, name)["selected"]
    return float(chosen["lambda_p1"]), float(chosen["lambda_p2"])


def selection_cells(chosen: dict) -> list[Cell]:
    """The validation cells of a pick file."""
    return [Cell(float(c["lambda"]), float(c["micro_f1"]), float(c["m1_p2c"])) for c in chosen["cells"]]
