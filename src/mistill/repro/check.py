"""Check numbers files against a profile's expected values and tolerances.

One line per value: id, key, expected, got, tolerance, class, verdict.

Verdicts: PASS (within tolerance; for a value the calibration marked descriptive, produced, of the
golden's shape and within its kind's range; for a null interval, an interval that contains zero up to the
tolerance of its ends), FAIL (breach), NOT REPRODUCED (no number
produced), NO EXPECTED (a number the profile records no expected value for),
ERROR (malformed file, unknown key, wrong profile).  A result never produced is
one NOT REPRODUCED line, never a pass.

What fails the run (exit status 1): any FAIL or ERROR; and a NOT REPRODUCED or
NO EXPECTED value of a *required* result, except a registered key beyond fixed
expected values (the paper's: a profile that runs more seeds or invariants than
the paper reports them for), which is listed and never fails.  Results named on the command line
are required; in a full run, the results whose registry status the profile
requires (registry.yaml `profiles.<p>.required_statuses`: on the demo only
`demo` results).  So a run restricted to produced ids passes, and a full demo
run lists the paper-only and planned results without failing on them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mistill.errors import UserError
from mistill.repro.numbers import numbers_path, read_numbers
from mistill.repro.registry import ALL_IDS, Registry
from mistill.repro.tolerance import compare, contains_zero, within_range

PASS, FAIL, NOT_REPRODUCED, NO_EXPECTED, ERROR = "PASS", "FAIL", "NOT REPRODUCED", "NO EXPECTED", "ERROR"
NUMBERS_NAME = re.compile(r"^R-[A-Z]+\d+\.json$")


@dataclass(frozen=True)
class CheckLine:
    result_id: str
    key: str
    expected: Any
    got: Any
    tolerance: str
    cls: str
    verdict: str
    fails: bool
    detail: str = ""


@dataclass
class CheckReport:
    profile: str
    results_dir: Path
    lines: list[CheckLine] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(line.fails for line in self.lines)

    def count(self, verdict: str) -> int:
        """Lines about one value (not about a whole result) with this verdict."""
        return sum(1 for line in self.lines if line.verdict == verdict and line.key != "*")

    def summary(self) -> str:
        # An error is one whether it concerns a value or a whole file (malformed, wrong profile, unknown id).
        errors = sum(1 for line in self.lines if line.verdict == ERROR)
        missing_results = [line for line in self.lines if line.key == "*" and line.verdict == NOT_REPRODUCED]
        required_missing = sum(1 for line in missing_results if line.fails)
        parts = [f"{self.count(PASS)} pass", f"{self.count(FAIL)} fail",
                 f"{self.count(NOT_REPRODUCED)} values not reproduced",
                 f"{self.count(NO_EXPECTED)} without expected values",
                 f"{errors} errors",
                 f"{len(missing_results)} results not reproduced ({required_missing} required)"]
        verdict = "FAILED" if self.failed else "OK"
        return f"profile {self.profile}, {self.results_dir}: " + ", ".join(parts) + f" -> {verdict}"

    def format(self) -> str:
        header = ("id", "key", "expected", "got", "tolerance", "class", "verdict")
        rows = [header] + [(ln.result_id, ln.key, fmt_value(ln.expected), fmt_value(ln.got), ln.tolerance,
                            ln.cls, ln.verdict + (f" ({ln.detail})" if ln.detail else ""))
                           for ln in self.lines]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
        out = ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1] for row in rows]
        return "\n".join(out + [self.summary()])


def run_check(registry: Registry, profile: str, results_dir: str | Path,
              ids: list[str] | None = None) -> CheckReport:
    """Check every (or the named) result's numbers file under `results_dir` for `profile`."""
    results_dir = Path(results_dir)
    explicit = bool(ids)
    if ids:
        unknown = [i for i in ids if i not in registry.results]
        if unknown:
            raise UserError(f"unknown result id(s) {', '.join(unknown)} (registered: R-C1..R-C15, R-D0..R-D46)")
        scope = list(dict.fromkeys(ids))
    else:
        scope = list(ALL_IDS)
    expected_set = registry.expected(profile)
    required_statuses = registry.required_statuses(profile)
    report = CheckReport(profile, results_dir)

    if not explicit and results_dir.is_dir():
        for path in sorted(results_dir.glob("R-*.json")):
            if path.stem not in registry.results:
                report.lines.append(CheckLine(path.stem, "*", None, None, "", "", ERROR, True,
                                              f"{path}: numbers file for an unknown result id"))

    for rid in scope:
        result = registry.results[rid]
        required = explicit or result.status in required_statuses
        expected = expected_set.values.get(rid, {})
        path = numbers_path(results_dir, rid)
        if not path.exists():
            why = "requested" if explicit else f"status {result.status}"
            need = "required" if required else "not required"
            report.lines.append(CheckLine(rid, "*", f"{len(expected)} values" if expected else None, None, "",
                                          "", NOT_REPRODUCED, required, f"{why}: {need}"))
            continue
        try:
            numbers = read_numbers(path, registry)
        except UserError as err:
            report.lines.append(CheckLine(rid, "*", None, None, "", "", ERROR, True, str(err)))
            continue
        if numbers.profile != profile:
            report.lines.append(CheckLine(rid, "*", None, None, "", "", ERROR, True,
                                          f"{path}: written under profile {numbers.profile!r}, checking {profile!r}"))
            continue
        for key, exp in expected.items():
            tol_text = exp.tolerance.describe()
            if key not in numbers.values:
                report.lines.append(CheckLine(rid, key, exp.value, None, tol_text, exp.cls, NOT_REPRODUCED,
                                              required, "the reader wrote no such value"))
                continue
            got = numbers.values[key]["value"]
            if exp.null_interval_why is not None:
                tol_text = exp.held_to()
                outcome = contains_zero(exp.value, got, exp.tolerance)
            elif exp.descriptive is not None:
                tol_text = exp.held_to()
                outcome = within_range(exp.value, got, exp.descriptive, any_length=exp.descriptive_any_length)
            else:
                outcome = compare(exp.value, got, exp.tolerance)
            verdict = PASS if outcome.passed else FAIL
            report.lines.append(CheckLine(rid, key, exp.value, got, tol_text, exp.cls, verdict,
                                          not outcome.passed, outcome.detail))
        # fixed expected values (the paper's, never blessed): a registered key they lack is beyond the paper
        fixed = bool(expected) and not expected_set.meta.get("blessable", False)
        for key, record in numbers.values.items():
            if key in expected:
                continue
            registered = key in registry.registered_keys(rid)
            if expected and not (fixed and registered):
                report.lines.append(CheckLine(rid, key, None, record["value"], "", "", ERROR, True,
                                              f"{path}: key {key!r} has no expected value under {profile}"))
            elif registered:
                why = (f"beyond the values {profile} is checked against: reported, not checked" if fixed
                       else f"no {profile} expected values for {rid} (bless them?)")
                report.lines.append(CheckLine(rid, key, None, record["value"], "", "", NO_EXPECTED,
                                              required and not fixed, why))
            else:
                report.lines.append(CheckLine(rid, key, None, record["value"], "", "", ERROR, True,
                                              f"{path}: unknown value key {key!r}"))
    return report


def fmt_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "[" + ", ".join(fmt_value(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
