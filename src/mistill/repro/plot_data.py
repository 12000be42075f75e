"""The paper's curves as data series that `dvc plots` draws (stage PLOTS; docs/remotes.md).

    <out>/knockin_by_k.json     one row per set size k: {k, P1, P2, P2C}, the median share of the clean
                                margin that knocking in the top-k heads recovers (R-C3's numbers file)
    <out>/necessity_by_k.json   the same rows for necessity (the share that ablating them removes)
    <out>/training/<run>.json   one row per optimiser step of a training run's metrics.jsonl: the step
                                and its loss terms (no timing or memory: the same series on any machine)

`dvc.yaml` declares the plots: the two curves by k with a line per phase (top-level `plots:`), and the
training directory with one plot per run (stage PLOTS), so `dvc plots show` draws them after `dvc repro`
or `dvc pull`, and `dvc plots diff <rev>` overlays another commit's. The residual-swap layer curve of App. F joins them once R-C12 is produced.
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path
from typing import Any

from mistill.errors import UserError
from mistill.io import write_json

PHASES = {"p1": "P1", "p2": "P2", "p2c": "P2C"}
SET_SIZE_KEY = re.compile(r"(knockin|necessity)_top(\d+)_(p1|p2|p2c)")
TIMING = ("step_time_s", "peak_memory_bytes")   # what the machine decides, not the run


def curves_by_k(values: dict[str, Any], measure: str) -> list[dict[str, Any]]:
    """Rows {k, P1, P2, P2C} of `measure` (knockin or necessity) from a numbers file's values, k ascending,
    at the set sizes every phase has (DVC draws a column only where each row holds it)."""
    curves: dict[str, dict[int, float]] = {}
    for key, record in values.items():
        m = SET_SIZE_KEY.fullmatch(key)
        if m and m.group(1) == measure and isinstance(record.get("value"), (int, float)):
            curves.setdefault(PHASES[m.group(3)], {})[int(m.group(2))] = float(record["value"])
    if not curves:
        return []
    shared = set.intersection(*(set(curve) for curve in curves.values()))
    phases = [phase for phase in PHASES.values() if phase in curves]
    return [{"k": k, **{phase: curves[phase][k] for phase in phases}} for k in sorted(shared)]


def training_curve(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per logged step: the step and every loss term, lr and gradient norm, nothing about timing."""
    return [{key: value for key, value in row.items() if key not in TIMING} for row in metrics]


def write_plot_data(knockin_numbers: Path, runs: list[Path], out: Path) -> dict[str, int]:
    """Write every series under `out` (replacing what a previous run wrote); returns rows per series."""
    from mistill.distill.trainer import read_metrics
    from mistill.repro.numbers import read_numbers

    values = read_numbers(knockin_numbers).values
    written: dict[str, int] = {}
    for measure in ("knockin", "necessity"):
        rows = curves_by_k(values, measure)
        if not rows:
            raise UserError(f"{knockin_numbers}: no {measure}_top<k>_<phase> values to plot")
        write_json(out / f"{measure}_by_k.json", rows)
        written[f"{measure}_by_k"] = len(rows)
    training = _fresh(out / "training")
    for campaign in runs:
        logs = sorted(campaign.glob("*/metrics.jsonl"))
        if not logs:
            raise UserError(f"{campaign}: no <run>/metrics.jsonl (run the training stages first)")
        for log in logs:
            curve = training_curve(read_metrics(log))
            write_json(training / f"{log.parent.name}.json", curve)
            written[f"training/{log.parent.name}"] = len(curve)
    return written


def _fresh(directory: Path) -> Path:
    """An empty `directory`: a series that no longer exists (a run removed from params) leaves no line behind."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("plot-data", help="the curves dvc plots draws: knock-in and necessity by k, "
                              "training losses per run")
    p.add_argument("--knockin", type=Path, default=Path("results/R-C3.json"),
                   help="the numbers file with knockin_top<k>_<phase> values (default: results/R-C3.json)")
    p.add_argument("--runs", type=Path, nargs="+", required=True,
                   help="training campaign directories (<runs_dir>/DT-000 ...), each holding <run>/metrics.jsonl")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.set_defaults(func=cmd_plot_data)


def cmd_plot_data(args: argparse.Namespace) -> int:
    written = write_plot_data(args.knockin, list(args.runs), args.out)
    print(f"plot data: {len(written)} series under {args.out} "
          f"({', '.join(f'{name} {n} rows' for name, n in list(written.items())[:3])}, ...)")
    return 0
