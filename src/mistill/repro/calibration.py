"""Tolerances from replicates: a demo value holds to the precision its replicates show.

`replicates.py` reruns the distillation chain under the perturbations another machine brings
(thread count, a few units in the last place of the students' weights) and under another training
seed. For every expected value of the calibrated results this module measures how far those
reruns move it from its golden ``g``:

    spread = max over elements e of  sqrt( mean over replicates j of (r_je - g_e)^2 )

(the root-mean-square deviation of the replicates from the golden, per element of a per-phase or
per-seed list, the widest element). Replicates run on a machine other than the goldens' are measured
from that machine's own unperturbed run instead (params `calibration.reference`, a directory of its
numbers files): ``g`` is then its value, so the spread measures the perturbations alone, and the
distance between the two machines is what the tolerances are tested on, not what they are sized
from. The value's tolerance becomes

    tolerance = m_k * spread,     m_k = t_k^-1( 1 - alpha / (2 n) )

rounded up to two significant digits, where k is the number of replicates that produced the value,
n the number of elements the calibration measured (every element of every value a replicate moved)
and alpha (params `calibration.family_alpha`, 0.05 on the demo) the chance that a run on a fresh
machine breaches any of the n tolerances. Why the t quantile: given the golden, a fresh machine's
deviation d_0 and the replicates' d_1..d_k are alike and independent; if they are N(0, s^2),
d_0 / sqrt(mean_j d_j^2) is Student-t with k degrees of freedom, exactly, and if they share an
offset (the golden's own distance from the value's mean) the ratio's tails are lighter. The union
bound over the n elements then holds a whole run's breach chance to alpha, however its values are
correlated. A multiple sized per value is not enough: 4 x RMS over five replicates is breached with
chance 1.0% per value (|t_5| > 4), 1.4 breaches per run over 136 calibrated values, and a fresh
clone's `nox -s repro` would fail more often than not. Each replicate more shrinks m_k (about 10 for
k = 5 and n = 300, 6 for k = 10).
A calibration never narrows a tolerance: where m_k x spread is within what the value's class
tolerance already allows (a value the replicates barely moved; a few replicates can under-state the
spread of a metric that moves in steps), the class tolerance stays, written out with a basis that
says the replicates measured it (CLASS_HELD). The value is then known to be measured: a second
machine's run (second_machine.py) judges only the values no replicate measured.

A value the replicates move whose tolerance, calibrated or kept, reaches zero from its golden
(``tolerance >= |g_e|`` for some element) does not say on another machine what it says here: a difference of arms whose sign a replicate
can flip, a p-value, a count of notes that can be zero. It is marked *descriptive*: the check
asks only that it is produced and lies in the range its kind allows (shares in [-1, 1] where
they are shares, p-values in [0, 1], counts >= 0), never for its value. A value no replicate
moved (spread 0: it does not depend on the chain's numerics, such as the teacher's own row) keeps
the tolerance it had. An invariant (basis "invariant ...") keeps its own.

A moved 95% interval of a difference (a key ending in `_interval`) whose golden contains zero says
"no difference shown", and that is what it is checked for: it becomes a *null interval*, whose check
asks that the interval still contains zero, whatever its ends (its ends move with the point estimate
from machine to machine; whether it covers zero is the finding), up to the calibrated tolerance of
its ends: an interval that leaves zero by less than the machine noise its ends carry does not
contradict "no difference shown" (`tolerance.contains_zero`). An interval that excludes zero
keeps the rule above: a finding while its tolerance keeps it off zero, descriptive otherwise.
`calibrate apply --marks-only` re-derives these marks from the expected values alone.

`apply_calibration` writes each calibrated tolerance into results/expected/<profile>.yaml with
the calibration's provenance, so `mistill repro check` and a later `bless` (which keeps a
value's own tolerance) use it.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

import yaml
from scipy.stats import t as student_t

from mistill.errors import UserError
from mistill.io import atomic_open, code_version, file_sha256, read_json, write_json
from mistill.repro.bless import HEADER, refuse_uncommitted_code
from mistill.repro.machine import describe_machine
from mistill.repro.numbers import read_numbers
from mistill.repro.registry import Registry, expected_path, kind_range
from mistill.repro.stage_times import replace_in_readme
from mistill.repro.tolerance import Tolerance, flatten, says_null, shape

SPREAD_FILE = "spread.json"
CALIBRATED = "calibrated"
CLASS_HELD = f"{CALIBRATED}: its class tolerance"     # a measured value whose class tolerance is the wider
UNMEASURED = "not yet measured by the replicates"    # how a second machine's mark begins (second_machine.py)
BREACHED = "a CPU change moved it beyond the replicates' spread"   # ... its mark on a calibrated value


@dataclass(frozen=True)
class Spread:
    """How far the replicates moved one value from its golden."""

    result_id: str
    key: str
    golden: Any
    replicates: dict[str, Any]          # replicate name -> its value (the replicates that produced the key)
    rms: list[float]                    # per element
    spread: float                       # the widest element's RMS
    other_shape: dict[str, Any] = field(default_factory=dict)   # replicates whose value is not comparable
    reference: Any = None               # the unperturbed run's value the deviations are measured from, if not the golden

    def to_json(self) -> dict[str, Any]:
        body = {"golden": self.golden, "replicates": self.replicates, "rms": self.rms, "spread": self.spread}
        if self.reference is not None:
            body["reference"] = self.reference
        if self.other_shape:
            body["other_shape"] = self.other_shape
        return body


def rms_deviation(golden: Any, values: list[Any]) -> list[float]:
    """Per element, sqrt(mean_j (value_j - golden)^2); a value of another shape is an error."""
    g = flatten(golden)
    if g is None:
        raise UserError(f"golden {golden!r} is not a number or list of numbers")
    squares = [0.0] * len(g)
    for value in values:
        v = flatten(value)
        if v is None or shape(value) != shape(golden):
            raise UserError(f"replicate value {value!r} does not have the golden's shape {golden!r}")
        for i, (a, b) in enumerate(zip(v, g)):
            squares[i] += (a - b) ** 2
    return [math.sqrt(s / len(values)) for s in squares]


def measure_spreads(registry: Registry, profile: str, replicate_dirs: list[Path],
                    results: tuple[str, ...], reference: Path | None = None) -> list[Spread]:
    """One Spread per expected value of `results` that at least one replicate produced, measured from the
    golden or, given `reference` (the numbers files of the replicates' machine's unperturbed run), from
    that run's value; a value the reference run did not produce in the golden's shape is not measured."""
    expected = registry.expected(profile).values
    numbers = {d.name: replicate_numbers(d, results, registry) for d in replicate_dirs}
    centres = {}
    if reference is not None:
        one_machine(replicate_dirs, reference)
        for rid in results:
            if not (reference / f"{rid}.json").is_file():
                raise UserError(f"calibration.reference {reference}: no {rid}.json (the unperturbed run must "
                                "have read every calibrated result)")
            centres[rid] = read_numbers(reference / f"{rid}.json", registry)
    spreads = []
    for rid in results:
        for key, exp in expected.get(rid, {}).items():
            if flatten(exp.value) is None:
                continue
            centre = exp.value
            if reference is not None:
                centre = centres[rid].values.get(key, {}).get("value")
                if centre is None or shape(centre) != shape(exp.value) or flatten(centre) is None:
                    continue
            produced = {name: per[rid].values[key]["value"] for name, per in numbers.items()
                        if rid in per and key in per[rid].values}
            # A replicate that trains under another seed writes a per-seed list of the one seed it trained:
            # not the same quantity as the golden's list over the profile's seeds, so not a deviation of it.
            comparable = {name: v for name, v in produced.items() if shape(v) == shape(exp.value)}
            if not comparable:
                continue
            other = {name: v for name, v in produced.items() if name not in comparable}
            rms = rms_deviation(centre, list(comparable.values()))
            spreads.append(Spread(rid, key, exp.value, comparable, rms, max(rms), other,
                                  reference=centre if reference is not None else None))
    return spreads


def replicate_numbers(replicate_dir: Path, results: tuple[str, ...], registry: Registry) -> dict:
    """The numbers files one replicate wrote for `results`. A result its `replicate.json` records under
    `not_read` has none (its perturbation leaves it unreadable); any other missing file is an unfinished
    or damaged replicate, refused rather than silently measured over fewer replicates."""
    done = replicate_dir / "replicate.json"
    not_read = read_json(done).get("replicate", {}).get("not_read", []) if done.is_file() else []
    numbers = {}
    for rid in results:
        path = replicate_dir / f"{rid}.json"
        if path.is_file():
            numbers[rid] = read_numbers(path, registry)
        elif rid not in not_read:
            raise UserError(f"{replicate_dir}: no {rid}.json, and its replicate.json does not list {rid} "
                            "under not_read; rerun `mistill repro calibrate run` to finish that replicate")
    return numbers


def one_machine(replicate_dirs: list[Path], reference: Path) -> None:
    """Refuse replicates run on CPUs of different types (replicate.json `cpu_type`) when they are measured
    from one machine's unperturbed run: each deviation would carry the distance between the CPUs too."""
    types = {d.name: read_json(d / "replicate.json").get("cpu_type", "not recorded") for d in replicate_dirs}
    if len(set(types.values())) > 1:
        listed = "; ".join(f"{name}: {cpu}" for name, cpu in types.items())
        raise UserError(f"calibration.reference {reference}: the replicates ran on CPUs of different types "
                        f"({listed}); rerun them on the reference run's CPU type, or measure them from the goldens")


def measured_elements(spreads: list[Spread]) -> int:
    """n of the module docstring: the elements of every value a replicate moved."""
    return sum(len(s.rms) for s in spreads if s.spread > 0)


def family_multiple(alpha: float, elements: int, replicates: int) -> float:
    """m_k of the module docstring: the two-sided Student-t quantile with `replicates` degrees of freedom
    at a per-element breach chance of alpha / elements."""
    if elements < 1 or replicates < 1:
        raise UserError(f"a family-wise multiple needs at least one element and one replicate "
                        f"(got {elements} and {replicates})")
    return float(student_t.ppf(1 - alpha / (2 * elements), df=replicates))


def write_spreads(path: Path, spreads: list[Spread], replicate_dirs: list[Path], family_alpha: float,
                  reference: Path | None = None) -> None:
    by_result: dict[str, dict[str, Any]] = {}
    for s in spreads:
        by_result.setdefault(s.result_id, {})[s.key] = s.to_json()
    replicates = {d.name: read_json(d / "replicate.json")["perturbation"] for d in replicate_dirs}
    write_json(path, {"family_alpha": family_alpha, "elements": measured_elements(spreads),
                      "reference": str(reference) if reference else "the goldens",
                      "replicates": replicates, "values": by_result})


def round_up(x: float, digits: int = 2) -> float:
    """`x` rounded up to `digits` significant digits (0.01234 -> 0.013). Float noise below twelve
    significant digits is dropped first, so 0.030000000000000002 is 0.03, not 0.031."""
    if x <= 0:
        return 0.0
    exact = Decimal(f"{x:.12g}")
    quantum = Decimal(1).scaleb(exact.adjusted() - digits + 1)
    return float(exact.quantize(quantum, rounding=ROUND_CEILING))


@dataclass(frozen=True)
class CalibratedValue:
    result_id: str
    key: str
    tolerance: float | None        # None: the present (class) tolerance stays, being the wider
    descriptive: bool
    range: list[float] | None
    null_interval: bool = False    # an interval that contains zero: checked for still containing it
    multiple: float = 0.0          # m_k of the module docstring, and the k replicates it was measured over
    replicates: tuple[str, ...] = ()
    measured: float = 0.0          # m_k x spread, rounded up: what the replicates asked for


def reaches_zero(tolerance: float, golden: list[float]) -> bool:
    """Whether some element of `golden` lies within `tolerance` of zero: what it says can change sign."""
    return any(tolerance >= abs(g) for g in golden)


def calibrate(spreads: list[Spread], multiple: Callable[[int], float], kinds: dict[tuple[str, str], str],
              floors: dict[tuple[str, str], float] | None = None,
              stats: dict[tuple[str, str], str] | None = None) -> list[CalibratedValue]:
    """The tolerance and marks of every value its replicates moved: m_k x spread where that exceeds its
    floor (the distance its present tolerance already allows, when given), else None (the floor stays);
    `multiple(k)` is m_k for a value k replicates produced. An interval of a difference that contains zero
    stays a null interval only while every replicate's interval contains zero too; one that a replicate
    moved off zero says different things on different machines: descriptive."""
    out = []
    floors, stats = floors or {}, stats or {}
    for s in spreads:
        if s.spread == 0:
            continue
        m = multiple(len(s.replicates))
        measured = round_up(m * s.spread)
        floor = floors.get((s.result_id, s.key), 0.0)
        tol = measured if measured > floor else None
        golden = flatten(s.golden) or []
        if says_null(s.key, s.golden):
            null = all(says_null(s.key, v) for v in s.replicates.values())
            descriptive = not null
        else:
            null, descriptive = False, reaches_zero(max(measured, floor), golden)
        # what a range must hold: every value seen, the reference run's too (a difference of recoveries that
        # one run put below -1 is not a proportion, whatever its kind)
        seen = golden + [x for v in [*s.replicates.values(), s.reference] for x in (flatten(v) or [])]
        where = (s.result_id, s.key)
        bounds = kind_range(kinds[where], seen, stats.get(where, "")) if descriptive else None
        out.append(CalibratedValue(s.result_id, s.key, tol, descriptive, bounds, null_interval=null,
                                   multiple=m, replicates=tuple(s.replicates), measured=measured))
    return out


NULL_CHECK = "a 95% interval of a difference that contains zero: checked for still containing zero"
NULL_WHY = (f"{NULL_CHECK}, up to the tolerance of its ends (no difference shown beyond the machine noise), not "
            "for its ends, which move with the point estimate on another machine")
DESCRIPTIVE_WHY = ("its replicates move it and its tolerance reaches zero from the golden: what it says can "
                   "change on another machine")


def mark(entry: dict[str, Any], c: CalibratedValue) -> None:
    """Write a calibrated value's mark, if it has one, into its expected-values entry (replacing the old
    ones); a value the calibration held to a number keeps a mark set for another reason (forget_calibration
    has taken the calibration's own)."""
    if not (c.null_interval or c.descriptive):
        return
    entry.pop("descriptive", None)
    entry.pop("null_interval", None)
    if c.null_interval:
        entry["null_interval"] = {"why": NULL_WHY}
    elif c.descriptive:
        entry["descriptive"] = {"range": c.range, "why": DESCRIPTIVE_WHY}


def expected_data(registry: Registry, profile: str) -> tuple[Path, dict[str, Any]]:
    """The profile's expected-values file and its raw mapping, as bless writes it."""
    data_path = expected_path(registry.root, profile)
    with data_path.open(encoding="utf-8") as fh:
        return data_path, yaml.safe_load(fh) or {}


def calibratable_expected(registry: Registry, profile: str) -> tuple[Path, dict[str, Any]]:
    """The profile's expected-values file and its contents, if its goldens may be calibrated from this tree."""
    data_path, data = expected_data(registry, profile)
    if not (data.get("meta") or {}).get("blessable", False):
        raise UserError(f"{data_path}: profile {profile!r} holds fixed expected values; nothing to calibrate")
    refuse_uncommitted_code(registry.root, registry.root / "results")
    return data_path, data


def apply_calibration(registry: Registry, profile: str, spread_path: Path) -> list[CalibratedValue]:
    """Write the calibrated tolerances of `spread_path` into results/expected/<profile>.yaml."""
    data_path, data = calibratable_expected(registry, profile)
    calibration = read_json(spread_path, "calibration spreads")
    spreads = []
    for rid, keys in calibration["values"].items():
        for key, rec in keys.items():
            current = data["expected"].get(rid, {}).get(key)
            if current is None:
                continue
            if current["value"] != rec["golden"]:
                raise UserError(f"{spread_path}: {rid}.{key} was measured against golden {rec['golden']!r}, "
                                f"the goldens now hold {current['value']!r}; rerun the calibration")
            spreads.append(Spread(rid, key, rec["golden"], rec["replicates"], rec["rms"], rec["spread"],
                                  reference=rec.get("reference")))
    for s in spreads:
        if s.spread > 0:
            forget_calibration(data["expected"][s.result_id][s.key])
    kinds = {(s.result_id, s.key): data["expected"][s.result_id][s.key]["kind"] for s in spreads}
    stats = {(s.result_id, s.key): data["expected"][s.result_id][s.key].get("stat", "") for s in spreads}
    floors = {(s.result_id, s.key): class_floor(registry, profile, s.result_id, s.key) for s in spreads}
    alpha, elements = float(calibration["family_alpha"]), int(calibration["elements"])
    reference = calibration.get("reference", "the goldens")
    centre = "the golden" if reference == "the goldens" else f"the unperturbed run {reference}"
    calibrated = calibrate(spreads, lambda k: family_multiple(alpha, elements, k), kinds, floors, stats)
    # an invariant keeps its own tolerance and value: what it checks is the invariant, not the run
    calibrated = [c for c in calibrated
                  if not tolerance_basis(data["expected"][c.result_id][c.key]).startswith("invariant")]
    for c in calibrated:
        entry = data["expected"][c.result_id][c.key]
        names = ", ".join(f"{n} ({calibration['replicates'][n]})" for n in c.replicates)
        sizing = (f"{c.multiple:.3g} x the RMS deviation from {centre} over {len(c.replicates)} replicates (the "
                  f"Student-t quantile that holds a run's {elements} calibrated elements to a chance of {alpha:g} "
                  f"of any breach)")
        if c.tolerance is not None:
            entry["tolerance"] = {"absolute": c.tolerance, "basis": f"{CALIBRATED}: {sizing}: {names}"}
        elif "tolerance" not in entry:    # a tolerance of its own that no calibration set stays as it is
            entry["tolerance"] = {**class_tolerance(registry, profile, c.result_id, c.key).to_spec(),
                                  "basis": f"{CLASS_HELD}, wider than {c.measured:g} = {sizing}: {names}"}
        mark(entry, c)
    adopt_twins(data["expected"])
    widen_ratio_ranges(data["expected"])
    data.setdefault("meta", {})["calibration"] = {
        "spreads": str(spread_path), "spreads_sha256": file_sha256(spread_path), "family_alpha": alpha,
        "elements": elements, "multiple": family_multiple(alpha, elements, len(calibration["replicates"])),
        "code_version": code_version(),
        "machine": describe_machine(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    write_expected(registry, profile, data_path, data)
    return calibrated


def forget_calibration(entry: dict[str, Any]) -> None:
    """Take from a value the replicates measure again what a calibration, or a second machine standing in for
    one, gave it: a calibrated tolerance (its own or a twin's), the marks calibrate() sets and a machine's
    marks ("not yet measured", "moved beyond the replicates' spread"). What the new spread asks for is then
    written afresh; a value it leaves within its class tolerance is held to that again. A mark for another
    reason stays."""
    if tolerance_basis(entry).startswith(CALIBRATED):
        entry.pop("tolerance")
    why = str((entry.get("descriptive") or {}).get("why", ""))
    if why == DESCRIPTIVE_WHY or why.startswith((UNMEASURED, BREACHED)):
        entry.pop("descriptive")
    if str((entry.get("null_interval") or {}).get("why", "")).startswith(NULL_CHECK):
        entry.pop("null_interval")


def class_floor(registry: Registry, profile: str, result_id: str, key: str) -> float:
    """What a value's tolerance allows before calibration (a calibration never narrows it): its class
    default, or a tolerance of its own that no calibration set."""
    exp = registry.expected(profile).values[result_id][key]
    tol = exp.tolerance
    if tol.basis.startswith(CALIBRATED):    # a re-calibration is floored at the class, not at the last one
        tol = class_tolerance(registry, profile, result_id, key)
    return min((tol.allowed(g) for g in flatten(exp.value) or []), default=0.0)


def class_tolerance(registry: Registry, profile: str, result_id: str, key: str) -> Tolerance:
    """The default tolerance of a value's nondeterminism classes and kind (registry.yaml)."""
    exp = registry.expected(profile).values[result_id][key]
    return registry.default_tolerance(exp.cls.split(","), exp.kind, where=f"{result_id}.{key}")


def calibrated_multiple(registry: Registry, profile: str) -> float:
    """The multiple of the spread that the goldens' calibration applied with every replicate
    (meta.calibration.multiple of the expected values)."""
    _, data = expected_data(registry, profile)
    multiple = ((data.get("meta") or {}).get("calibration") or {}).get("multiple")
    if multiple is None:
        raise UserError(f"results/expected/{profile}.yaml records no calibration: run "
                        "`mistill repro calibrate apply` first")
    return float(multiple)


def significant(x: Any) -> bool:
    """A float of at least 9 significant digits: a number that cannot coincide with another by chance."""
    return isinstance(x, float) and len(repr(abs(x)).split("e")[0].replace(".", "").strip("0")) >= 9


TWIN = " the same number as "


def tolerance_basis(entry: dict[str, Any]) -> str:
    """The basis of an expected-values entry's own tolerance ("" for one held to its class's)."""
    return str((entry.get("tolerance") or {}).get("basis", ""))


def adopt_twins(expected: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """Give a value the replicates did not measure the calibration of its twin: a calibrated value whose
    golden is the same number, bit for bit, read by another result's reader (R-D12's per-seed own-heads
    medians of the bf16 Vanilla students are R-D6's). One number is then held to one tolerance and its
    marks, wherever it is reported. Only goldens holding a float of 9 or more significant digits are
    matched (a round 0, 1 or 0.5 can coincide without being the same number); a value with a tolerance
    or a mark of its own keeps it. Returns (result, key, twin's result, twin's key) per adopted value.
    """
    calibrated: dict[tuple[str, tuple], tuple[str, str]] = {}
    for rid, keys in expected.items():
        for key, entry in keys.items():
            basis = tolerance_basis(entry)
            numbers = tuple(flatten(entry["value"]) or ())
            if basis.startswith(CALIBRATED) and TWIN not in basis and any(map(significant, numbers)):
                calibrated.setdefault((entry.get("kind", "share"), numbers), (rid, key))
    adopted = []
    for rid, keys in expected.items():
        for key, entry in keys.items():
            adopted_before = TWIN in tolerance_basis(entry)
            if not adopted_before and any(mark in entry for mark in ("tolerance", "descriptive", "null_interval")):
                continue
            twin = calibrated.get((entry.get("kind", "share"), tuple(flatten(entry["value"]) or ())))
            if twin is None:
                continue
            source = expected[twin[0]][twin[1]]
            entry["tolerance"] = {**source["tolerance"],
                                  "basis": f"{CALIBRATED}:{TWIN}{twin[0]}.{twin[1]}, whose tolerance it "
                                           f"takes ({source['tolerance']['basis']})"}
            for mark in ("descriptive", "null_interval"):     # a twin's marks are its source's, as they are now
                entry.pop(mark, None)
                if mark in source:
                    entry[mark] = dict(source[mark])
            adopted.append((rid, key, *twin))
    return adopted


def widen_ratio_ranges(expected: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """Descriptive ranges bounded as a proportion's whose statistic names a ratio become unbounded (marks
    written before kind_range read the statistic); returns the (result, key) pairs widened."""
    widened = []
    for rid, keys in expected.items():
        for key, entry in keys.items():
            bounds = (entry.get("descriptive") or {}).get("range")
            if bounds is None or not math.isfinite(bounds[0]) or not math.isfinite(bounds[1]):
                continue
            if kind_range(entry["kind"], list(bounds), entry.get("stat", "")) == [-math.inf, math.inf]:
                entry["descriptive"]["range"] = [-math.inf, math.inf]
                widened.append((rid, key))
    return widened


def write_expected(registry: Registry, profile: str, data_path: Path, data: dict[str, Any]) -> None:
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=120, default_flow_style=None)
    with atomic_open(data_path, "w", encoding="utf-8") as fh:
        fh.write(HEADER.format(profile=profile) + text)
    registry._expected.pop(profile, None)
    registry.expected(profile)


def remark_from_expected(registry: Registry, profile: str) -> list[CalibratedValue]:
    """The marks of the values the last calibration set, derived again from the expected values alone
    (`calibrate apply --marks-only`, after a re-bless moved goldens under the tolerances it kept).

    A calibrated interval of a difference that contains zero is a null interval.  Any other calibrated
    value whose tolerance reaches zero from its golden is descriptive: calibrate()'s own rule, with the
    kept tolerance standing for m_k times the spread it was measured from.  Marks are only added, never
    removed: a value the replicates made descriptive stays so until they are run again.  Tolerances and
    uncalibrated values are left as they are.
    """
    data_path, data = calibratable_expected(registry, profile)
    adopted = adopt_twins(data["expected"])
    if adopted:
        write_expected(registry, profile, data_path, data)
    expected = registry.expected(profile).values
    marked = []
    for rid, keys in data["expected"].items():
        for key, entry in keys.items():
            basis = tolerance_basis(entry)
            if not basis.startswith(CALIBRATED) or "null_interval" in entry or "descriptive" in entry:
                continue
            if says_null(key, entry["value"]):
                c = CalibratedValue(rid, key, None, False, None, null_interval=True)
            else:
                exp = expected[rid][key]
                golden = flatten(exp.value) or []
                if not any(reaches_zero(exp.tolerance.allowed(g), [g]) for g in golden):
                    continue
                c = CalibratedValue(rid, key, None, True, kind_range(exp.kind, golden, exp.stat))
            mark(entry, c)
            marked.append(c)
    if marked:
        write_expected(registry, profile, data_path, data)
    return marked


def rewrite_value_checks(doc: Path, registry: Registry, profile: str) -> None:
    """The guide's per-result table of how each distillation value is checked (docs/tolerances.md), and every
    value's check in demo-values.md beside it: both read the expected values alone."""
    distillation = tuple(sorted((rid for rid in registry.results if rid.startswith("R-D")), key=lambda r: int(r[3:])))
    replace_in_readme(doc, checks_table(registry, profile, list(distillation)), CHECKS_BEGIN, CHECKS_END)
    values_doc = doc.parent / VALUES_DOC
    with atomic_open(values_doc, "w", encoding="utf-8") as fh:
        fh.write(VALUES_DOC_HEAD.format(profile=profile) + findings_table(registry, profile, distillation, every=True)
                 + "\n")
    print(f"rewrote the value-checks table in {doc} and every value's check in {values_doc}")


VALUES_DOC = "demo-values.md"   # beside the guide that holds the value-checks table
VALUES_DOC_HEAD = """# How each distillation value of the {profile} profile is checked

Generated by `mistill repro calibrate machine <run> --doc` from `results/expected/{profile}.yaml`
(docs/tolerances.md). *A finding*: a calibrated value whose interval, golden ±
tolerance, excludes zero. *A null finding*: a 95% interval of a difference that contains zero and is
checked for still containing it, up to the tolerance of its ends. *Descriptive*: checked for
presence and range only, with why. *A number held to its tolerance*: a class tolerance that no
replicate and no second machine has challenged.

"""
CHECKS_BEGIN = "<!-- value-checks:begin (generated by `mistill repro calibrate machine <run> --doc`) -->"
CHECKS_END = "<!-- value-checks:end -->"


def checks_table(registry: Registry, profile: str, results: list[str]) -> str:
    """Markdown: per result, how its expected values are checked: as numbers (class or calibrated
    tolerance; of those, intervals of a difference that exclude zero are findings), as null intervals,
    or only described."""
    rows = ["| result | values | numbers, class tolerance | numbers, calibrated | of those, findings | "
            "null intervals | descriptive |", "|---|---:|---:|---:|---:|---:|---:|"]
    for rid in results:
        values = registry.expected(profile).values.get(rid, {})
        if not values:
            continue
        numbers = [e for e in values.values() if e.descriptive is None and e.null_interval_why is None]
        calibrated = sum(e.tolerance.basis.startswith(CALIBRATED) for e in numbers)
        findings = sum(1 for e in numbers if e.key.endswith("_interval") and not says_null(e.key, e.value))
        null = sum(e.null_interval_why is not None for e in values.values())
        described = sum(e.descriptive is not None for e in values.values())
        rows.append(f"| {rid} | {len(values)} | {len(numbers) - calibrated} | {calibrated} | {findings} | {null} | "
                    f"{described} |")
    return "\n".join(rows)


README_BEGIN = "<!-- calibrated-findings:begin (generated by `mistill repro calibrate apply --doc`) -->"
README_END = "<!-- calibrated-findings:end -->"


def findings_table(registry: Registry, profile: str, results: tuple[str, ...], *, every: bool = False) -> str:
    """Markdown: every calibrated, descriptive or null-interval value of `results` (`every`: every value),
    its golden, its interval (golden ± its tolerance) and whether the demo shows it as a finding, a null
    finding, a number held to its class tolerance, or only descriptively."""
    rows = ["| result | value | golden | golden ± tolerance | the demo shows |", "|---|---|---:|---|---|"]
    for rid in results:
        for key, exp in registry.expected(profile).values.get(rid, {}).items():
            calibrated = exp.tolerance.basis.startswith(CALIBRATED)
            marked = exp.descriptive is not None or exp.null_interval_why is not None
            if not (every or calibrated or marked):
                continue
            golden = flatten(exp.value) or []
            interval = "; ".join(f"[{g - exp.tolerance.allowed(g):.3g}, {g + exp.tolerance.allowed(g):.3g}]"
                                 for g in golden)
            if exp.null_interval_why is not None:
                shown = "a null finding (checked: the interval still contains zero, up to its ends' tolerance)"
            elif exp.descriptive is not None and exp.descriptive_why != DESCRIPTIVE_WHY:
                shown = f"descriptive ({exp.descriptive_why.split(';')[0].strip()})"   # a mark set by hand
            elif exp.descriptive is not None:
                shown = "descriptive (the interval reaches zero)"
            elif not calibrated:
                shown = f"a number held to its tolerance ({exp.tolerance.describe()})"
            else:
                shown = "a finding (the interval excludes zero)"
            value = ", ".join(f"{g:.3g}" for g in golden)
            rows.append(f"| {rid} | `{key}` | {value} | {interval} | {shown} |")
    return "\n".join(rows)
