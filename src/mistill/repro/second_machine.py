"""A second machine's run: the values it moved further than the replicates measured are only described.

The replicates (`replicates.py`) size the tolerances of the results they rerun: the main arms of
the distillation chain. The rest of the chain is not rerun by them (a replicate of the grid would be
the whole grid, hours per replicate on two cores), so those values keep their class tolerances, which
were never measured against anything. The evidence for them is a whole run of the chain on a machine
of another CPU type: a fresh clone's numbers files, committed under
``calibration/machines/<name>/results`` beside ``machine.yaml`` (the CPU, the commit, the command).

One run cannot size a tolerance. If two machines' deviations from the golden are independent and
alike, the chance that a third machine's deviation exceeds ``m`` times the one run's is
``(2/pi) arctan(1/m)``: about one in six for ``m = 4``, for every value. What one run can show is
that a value moves. So, per expected value that carries no calibrated tolerance, no invariant basis
and no mark yet, with ``move = max over elements |other_e - golden_e|``:

* ``multiple * move <= allowed(golden)``: kept. Its class tolerance is at least `multiple` times the
  distance the other machine moved it (`multiple` is the one the goldens' calibration applied,
  ``meta.calibration.multiple`` of the expected values), the margin the replicates would have asked for.
* otherwise, a 95% interval of a difference that contains zero on both machines: a *null interval*,
  checked for still containing zero (calibration.py says why);
* otherwise: *descriptive*, checked for presence and for the range its kind allows, with the move
  in its ``why``, until the replicates measure its spread;
* a list the other machine produced with another length (the cells a validation walk visited before
  its rule stopped it): descriptive with ``length: any``, its elements checked for range.

A null interval, from the replicates or from an earlier run, that the other machine's interval leaves
by more than the tolerance of its ends (the check's rule) is descriptive too: whether the demo shows
the difference is not settled. So is a calibrated value whose tolerance the other machine breaches:
the replicates' perturbations stand in for a CPU change, and for this value they moved it less than a
real one did, so its spread is not measured after all. (When the other machine is the one the
replicates ran on, `calibration.reference`, its run no longer tests those values' tolerances: they
are marked from it.)

A value the other machine did not produce is left as it is; a numbers file of another profile is an
error. `mistill repro calibrate machine <dir>` applies the rule and records the run in the expected
values' ``meta.machines``; a later `bless` keeps the marks (bless.py), as it keeps the calibration's.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mistill.errors import UserError
from mistill.io import code_version
from mistill.repro.calibration import (
    BREACHED,
    CALIBRATED,
    NULL_WHY,
    UNMEASURED,
    calibratable_expected,
    calibrated_multiple,
    rewrite_value_checks,
    write_expected,
)
from mistill.repro.numbers import read_numbers
from mistill.repro.registry import Expected, Registry, kind_range
from mistill.repro.tolerance import compare, contains_zero, flat_numbers, flatten, says_null, shape

MACHINE_FILE = "machine.yaml"
KEPT, NULL, DESCRIPTIVE = "kept", "null interval", "descriptive"


@dataclass(frozen=True)
class MachineRun:
    """A whole run of the chain on another machine: where its numbers files are and what it ran on."""

    name: str
    results: Path
    cpu: str
    code_version: str
    command: str

    @classmethod
    def load(cls, directory: Path) -> MachineRun:
        path = directory / MACHINE_FILE
        if not path.is_file():
            raise UserError(f"{directory}: no {MACHINE_FILE} (cpu, code_version, command of the run)")
        with path.open(encoding="utf-8") as fh:
            meta = yaml.safe_load(fh) or {}
        missing = [k for k in ("cpu", "code_version", "command") if not meta.get(k)]
        if missing:
            raise UserError(f"{path}: missing {', '.join(missing)}")
        results = directory / "results"
        if not sorted(results.glob("R-*.json")):
            raise UserError(f"{results}: no numbers files (R-*.json) of the run")
        return cls(directory.name, results, str(meta["cpu"]), str(meta["code_version"]), str(meta["command"]))


@dataclass(frozen=True)
class MachineMove:
    """What the other machine did to one expected value, and what the rule makes of it."""

    result_id: str
    key: str
    move: float
    allowed: float
    outcome: str                   # KEPT, NULL or DESCRIPTIVE
    range: list[float] | None = None
    any_length: bool = False       # the other machine's list has another length
    off_zero: bool = False         # a null interval that the other machine's interval no longer contains zero
    breached: bool = False         # a calibrated tolerance the other machine's value breaches

    @property
    def measured(self) -> bool:
        """Whether the value had been measured (a null interval or a calibrated tolerance) before this run."""
        return self.off_zero or self.breached


def unmeasured(exp: Expected) -> bool:
    """A value the rule may mark: no calibrated tolerance, no invariant, no mark yet."""
    basis = exp.tolerance.basis
    return not (basis.startswith(CALIBRATED) or basis.startswith("invariant")
                or exp.descriptive is not None or exp.null_interval_why is not None)


def judge(exp: Expected, other: Any, multiple: float) -> MachineMove | None:
    """The rule of the module docstring for one value; None when the other value is not comparable
    (another shape, or not numbers), which the check of that run reports as it is."""
    golden, got = flatten(exp.value), flatten(other)
    if golden is None or got is None:
        return None
    if shape(other) != shape(exp.value):
        if not (flat_numbers(exp.value) and flat_numbers(other)):
            return None
        # a list whose length the run decides (a validation walk that stopped elsewhere): it moved
        return MachineMove(exp.result_id, exp.key, math.inf, exp.tolerance.allowed(0.0), DESCRIPTIVE,
                           kind_range(exp.kind, golden + got, exp.stat), any_length=True)
    move = max((abs(g - o) for g, o in zip(golden, got)), default=0.0)
    if math.isnan(move):
        return None
    if exp.tolerance.interval is not None:          # an absolute range: the move is judged against its width
        allowed = (exp.tolerance.interval[1] - exp.tolerance.interval[0]) / 2
    else:
        allowed = min(exp.tolerance.allowed(g) for g in golden) if golden else 0.0
    if multiple * move <= allowed:
        return MachineMove(exp.result_id, exp.key, move, allowed, KEPT)
    if says_null(exp.key, exp.value) and says_null(exp.key, other):
        return MachineMove(exp.result_id, exp.key, move, allowed, NULL)
    return MachineMove(exp.result_id, exp.key, move, allowed, DESCRIPTIVE,
                       kind_range(exp.kind, golden + got, exp.stat))


def contradicted_null(exp: Expected, other: Any) -> MachineMove | None:
    """A null interval whose interval on the other machine leaves zero by more than the tolerance of its
    ends (the check's rule, `tolerance.contains_zero`): descriptive from now on."""
    if exp.null_interval_why is None or not flat_numbers(other) or shape(other) != shape(exp.value):
        return None
    if contains_zero(exp.value, other, exp.tolerance).passed:
        return None
    golden, got = flatten(exp.value), flatten(other)
    move = max(abs(g - o) for g, o in zip(golden, got))
    return MachineMove(exp.result_id, exp.key, move, exp.tolerance.allowed(0.0), DESCRIPTIVE,
                       kind_range(exp.kind, golden + got, exp.stat), off_zero=True)


def breached_calibration(exp: Expected, other: Any) -> MachineMove | None:
    """A calibrated value (not a null interval, not descriptive) whose tolerance the other machine's value
    breaches: descriptive from now on, since a CPU change moved it further than the replicates did."""
    if (not exp.tolerance.basis.startswith(CALIBRATED) or exp.descriptive is not None
            or exp.null_interval_why is not None or flatten(other) is None or shape(other) != shape(exp.value)):
        return None
    if compare(exp.value, other, exp.tolerance).passed:
        return None
    golden, got = flatten(exp.value), flatten(other)
    move = max(abs(g - o) for g, o in zip(golden, got))
    allowed = min(exp.tolerance.allowed(g) for g in golden)
    return MachineMove(exp.result_id, exp.key, move, allowed, DESCRIPTIVE,
                       kind_range(exp.kind, golden + got, exp.stat), breached=True)


def measure_moves(registry: Registry, profile: str, run: MachineRun, multiple: float) -> list[MachineMove]:
    """One MachineMove per unmeasured expected value that the other machine produced, one per null
    interval it moved off zero and one per calibrated tolerance it breached."""
    expected = registry.expected(profile).values
    moves = []
    for path in sorted(run.results.glob("R-*.json")):
        numbers = read_numbers(path, registry)
        if numbers.profile != profile:
            raise UserError(f"{path}: a numbers file of profile {numbers.profile!r}, not {profile!r}")
        for key, exp in expected.get(numbers.id, {}).items():
            if key not in numbers.values:
                continue
            other = numbers.values[key]["value"]
            if unmeasured(exp):
                judged = judge(exp, other, multiple)
            else:
                judged = contradicted_null(exp, other) or breached_calibration(exp, other)
            if judged is not None:
                moves.append(judged)
    return moves


def why(run: MachineRun, m: MachineMove, multiple: float) -> str:
    if m.off_zero:
        return (f"a 95% interval of a difference that contains zero here, and not on {run.name} ({run.cpu}): "
                f"whether the demo shows the difference depends on the machine, so it is only described")
    if m.breached:
        return (f"{BREACHED}: calibrated to ±{m.allowed:.3g}, a run on {run.name} ({run.cpu}) moved it by "
                f"{m.move:.3g}; checked for presence and range until a calibration measures a spread that holds")
    if m.any_length:
        return (f"{UNMEASURED}; a run on {run.name} ({run.cpu}) gave a list of another "
                f"length (a walk that stopped elsewhere): checked for presence and range, of any length, until "
                f"the replicates measure it")
    return (f"{UNMEASURED}; a run on {run.name} ({run.cpu}) moved it by {m.move:.3g}, "
            f"more than 1/{multiple:g} of its tolerance ({m.allowed:.3g}), and one run cannot size a "
            f"tolerance: checked for presence and range until the replicates measure its spread")


def apply_machine_run(registry: Registry, profile: str, run: MachineRun, multiple: float) -> list[MachineMove]:
    """Mark the values `run` moved in results/expected/<profile>.yaml; return every judged value."""
    data_path, data = calibratable_expected(registry, profile)
    moves = measure_moves(registry, profile, run, multiple)
    if run.name in (data.get("meta") or {}).get("machines", {}) and all(m.outcome == KEPT for m in moves):
        return moves        # applied before and nothing new to mark: the file (and its provenance) stays as it is
    for m in moves:
        entry = data["expected"][m.result_id][m.key]
        if m.outcome == NULL:
            entry["null_interval"] = {"why": NULL_WHY}
        elif m.outcome == DESCRIPTIVE:
            entry.pop("null_interval", None)
            entry["descriptive"] = {"range": m.range, "why": why(run, m, multiple)}
            if m.any_length:
                entry["descriptive"]["length"] = "any"
    data.setdefault("meta", {}).setdefault("machines", {})[run.name] = {
        "results": _relative(run.results, registry.root), "cpu": run.cpu, "run_code_version": run.code_version, "command": run.command,
        "applied_code_version": code_version(), "multiple": multiple,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    write_expected(registry, profile, data_path, data)
    return moves


def _relative(path: Path, root: Path) -> str:
    """`path` as the repository names it (relative to its root) where it lies inside, else as given."""
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def cmd_machine(args) -> int:
    """`mistill repro calibrate machine <run> [--dry-run] [--doc [PATH]]`."""
    from mistill.params import load_params
    from mistill.repro.registry import load_registry
    from mistill.repro.registry_md import write_registry_md
    params = load_params()
    registry = load_registry()
    multiple = calibrated_multiple(registry, params["profile"])
    run = MachineRun.load(args.run)
    if args.dry_run:
        moves = measure_moves(registry, params["profile"], run, multiple)
    else:
        moves = apply_machine_run(registry, params["profile"], run, multiple)
        write_registry_md(registry)
    for m in moves:
        if m.outcome != KEPT:
            print(f"{m.result_id}.{m.key}: moved {m.move:.3g} (tolerance {m.allowed:.3g}): {m.outcome}")
    marked = [m for m in moves if m.outcome != KEPT]
    verb = "would mark" if args.dry_run else "marked"
    if args.doc is not None and not args.dry_run:
        rewrite_value_checks(args.doc, load_registry(), params["profile"])
    unmeasured_moves = [m for m in moves if not m.measured]
    print(f"{run.name} ({run.cpu}): {len(unmeasured_moves)} unmeasured values compared, "
          f"{sum(m.move > 0 for m in unmeasured_moves)} moved, {len(moves) - len(marked)} kept (moved at most "
          f"1/{multiple:g} of their tolerance), {verb} {len(marked)} (of which "
          f"{sum(m.off_zero for m in moves)} null intervals it moved off zero and "
          f"{sum(m.breached for m in moves)} calibrated tolerances it breached)")
    return 0
