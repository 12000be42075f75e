"""Tolerances: how far a reproduced number may sit from its expected value.

A tolerance is one of three forms, each citing the nondeterminism class that
justifies it (App. Q, "Reproducibility"; classes G, K, T, F, none):

* absolute  ``|got - expected| <= a``
* relative  ``|got - expected| <= r * |expected|``; written together with an
  absolute floor the allowed distance is ``max(a, r * |expected|)``
* interval  ``lo <= got <= hi`` (the paper's 95% interval where it gives one:
  "reruns reproduce the reported statistics within the stated intervals")

List values (per-phase tuples, per-seed rows) are compared element by element;
an interval applies to scalars only.  Counts exact given stored artifacts get
``absolute: 0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from mistill.errors import UserError

Number = int | float


@dataclass(frozen=True)
class Tolerance:
    absolute: float = 0.0
    relative: float = 0.0
    interval: tuple[float, float] | None = None
    cls: str = "none"          # the nondeterminism class it cites
    basis: str = ""            # why this size (the paper's figure it derives from)

    @classmethod
    def from_spec(cls, spec: dict[str, Any], *, cls_name: str, where: str) -> Tolerance:
        """Parse ``{absolute: a, relative: r}`` or ``{interval: [lo, hi]}`` (plus an optional basis)."""
        if not isinstance(spec, dict):
            raise UserError(f"{where}: tolerance must be a mapping, got {spec!r}")
        unknown = set(spec) - {"absolute", "relative", "interval", "basis"}
        if unknown:
            raise UserError(f"{where}: unknown tolerance field(s) {', '.join(sorted(unknown))}")
        interval = spec.get("interval")
        if interval is not None:
            if (not isinstance(interval, list) or len(interval) != 2
                    or not all(is_number(x) for x in interval) or interval[0] > interval[1]):
                raise UserError(f"{where}: tolerance interval must be [lo, hi] with lo <= hi, got {interval!r}")
            if "absolute" in spec or "relative" in spec:
                raise UserError(f"{where}: a tolerance is either an interval or absolute/relative, not both")
            return cls(interval=(float(interval[0]), float(interval[1])), cls=cls_name,
                       basis=str(spec.get("basis", "")))
        absolute = spec.get("absolute", 0.0)
        relative = spec.get("relative", 0.0)
        for name, x in (("absolute", absolute), ("relative", relative)):
            if not is_number(x) or x < 0:
                raise UserError(f"{where}: tolerance {name} must be a number >= 0, got {x!r}")
        return cls(absolute=float(absolute), relative=float(relative), cls=cls_name,
                   basis=str(spec.get("basis", "")))

    def to_spec(self) -> dict[str, Any]:
        if self.interval is not None:
            return {"interval": [self.interval[0], self.interval[1]]}
        spec: dict[str, Any] = {"absolute": self.absolute}
        if self.relative:
            spec["relative"] = self.relative
        return spec

    @property
    def exact(self) -> bool:
        return self.interval is None and self.absolute == 0 and self.relative == 0

    def allowed(self, expected: float) -> float:
        """The allowed distance from a scalar expected value (absolute/relative forms)."""
        return max(self.absolute, self.relative * abs(expected))

    def describe(self) -> str:
        if self.interval is not None:
            return f"in [{_fmt(self.interval[0])}, {_fmt(self.interval[1])}]"
        if self.exact:
            return "exact"
        if self.relative and self.absolute:
            return f"±max({_fmt(self.absolute)}, {_fmt(self.relative * 100)}%)"
        if self.relative:
            return f"±{_fmt(self.relative * 100)}%"
        return f"±{_fmt(self.absolute)}"


@dataclass(frozen=True)
class Comparison:
    passed: bool
    max_excess: float       # how far beyond the tolerance the worst element lies (<= 0 when passed)
    max_diff: float         # largest |got - expected| over elements
    detail: str             # empty when passed; otherwise which elements breach and by how much


def flatten(value: Any) -> list[float] | None:
    """The numbers of a scalar or (nested) list value, in order; None when anything is not a number."""
    if is_number(value):
        return [value]
    if isinstance(value, list):
        out: list[float] = []
        for item in value:
            sub = flatten(item)
            if sub is None:
                return None
            out.extend(sub)
        return out
    return None


def shape(value: Any) -> Any:
    if isinstance(value, list):
        return [shape(v) for v in value]
    return None


def _paired(expected: Any, got: Any) -> tuple[list[float], list[float], Comparison | None]:
    """Both values' numbers in order, or the breach that makes them incomparable (not numbers, or
    of another shape)."""
    exp_flat, got_flat = flatten(expected), flatten(got)
    if exp_flat is None or got_flat is None:
        return [], [], Comparison(False, math.inf, math.inf, "not a number or list of numbers")
    if shape(expected) != shape(got):
        return [], [], Comparison(False, math.inf, math.inf,
                                  f"shape differs: expected {len(exp_flat)} element(s), got {len(got_flat)}")
    return exp_flat, got_flat, None


def compare(expected: Any, got: Any, tol: Tolerance) -> Comparison:
    """Compare elementwise; a shape mismatch is a breach."""
    exp_flat, got_flat, mismatch = _paired(expected, got)
    if mismatch is not None:
        return mismatch
    if tol.interval is not None and len(exp_flat) != 1:
        return Comparison(False, math.inf, math.inf, "an interval tolerance applies to scalars only")
    breaches: list[str] = []
    max_excess = -math.inf
    max_diff = 0.0
    for i, (e, g) in enumerate(zip(exp_flat, got_flat)):
        if not math.isfinite(g):
            excess, diff = math.inf, math.inf
        elif tol.interval is not None:
            lo, hi = tol.interval
            excess = max(lo - g, g - hi)
            diff = abs(g - e)
        else:
            diff = abs(g - e)
            excess = diff - tol.allowed(e)
        # Values are printed with few digits; forgive float noise below 1e-12 of scale.
        if excess > 1e-12 * max(1.0, abs(e)):
            where = f"[{i}] " if len(exp_flat) > 1 else ""
            breaches.append(f"{where}off by {_fmt(diff)}")
        max_excess = max(max_excess, excess)
        max_diff = max(max_diff, diff)
    return Comparison(not breaches, max_excess, max_diff, "; ".join(breaches))


def within_range(expected: Any, got: Any, bounds: tuple[float, float], *, any_length: bool = False) -> Comparison:
    """A descriptive value: of the expected value's shape (with `any_length`, a non-empty flat list of any
    length), finite, every element in [lo, hi]."""
    if any_length and flat_numbers(got) and flat_numbers(expected):
        exp_flat, got_flat = list(expected), list(got)
    else:
        exp_flat, got_flat, mismatch = _paired(expected, got)
        if mismatch is not None:
            return mismatch
    lo, hi = bounds
    outside = [f"[{i}] {_fmt(g)}" if len(got_flat) > 1 else _fmt(g)
               for i, g in enumerate(got_flat) if not (math.isfinite(g) and lo <= g <= hi)]
    max_diff = max((abs(g - e) for e, g in zip(exp_flat, got_flat)), default=0.0)
    if outside:
        return Comparison(False, math.inf, max_diff, f"outside [{_fmt(lo)}, {_fmt(hi)}]: {', '.join(outside)}")
    return Comparison(True, -math.inf, max_diff, "")


def flat_numbers(value: Any) -> bool:
    """A non-empty list of numbers, none of them a list."""
    return isinstance(value, list) and bool(value) and all(is_number(v) for v in value)


def says_null(key: str, value: Any) -> bool:
    """Whether `value` is an interval of a difference (a key ending in `_interval`, [lo, hi]) that contains
    zero: what it says is "no difference shown", and a null interval is checked for saying it still."""
    return (key.endswith("_interval") and isinstance(value, list) and len(value) == 2
            and all(is_number(v) for v in value) and value[0] <= 0 <= value[1])


def contains_zero(expected: Any, got: Any, tol: Tolerance | None = None) -> Comparison:
    """A null interval: `got` is a finite [lo, hi] with lo <= hi that still contains zero, whatever its ends,
    up to the noise its ends carry.

    The ends move with the point estimate on another machine by as much as the value's tolerance allows
    (for a calibrated value, the stated multiple of the replicates' spread), so "no difference shown" is
    contradicted only when the interval leaves zero by more than that:
    ``lo - t(lo_golden) <= 0 <= hi + t(hi_golden)``, with t the tolerance's allowed distance
    (`Tolerance.allowed`; none for an interval-form tolerance or none given).
    """
    exp_flat, got_flat, mismatch = _paired(expected, got)
    if mismatch is not None:
        return mismatch
    max_diff = max((abs(g - e) for e, g in zip(exp_flat, got_flat)), default=0.0)
    if len(got_flat) != 2 or not all(math.isfinite(g) for g in got_flat) or got_flat[0] > got_flat[1]:
        return Comparison(False, math.inf, max_diff, f"not a finite interval [lo, hi]: {got!r}")
    lo, hi = got_flat
    slack_lo, slack_hi = ((tol.allowed(exp_flat[0]), tol.allowed(exp_flat[1]))
                          if tol is not None and tol.interval is None else (0.0, 0.0))
    gap = max(lo, -hi, 0.0)                      # how far the interval lies from zero
    slack = slack_lo if lo > 0 else slack_hi
    if gap > slack:
        within = f", beyond its ends' tolerance {_fmt(slack)}" if slack else ""
        return Comparison(False, gap - slack, max_diff,
                          f"[{_fmt(lo)}, {_fmt(hi)}] no longer contains 0 (off by {_fmt(gap)}{within}): "
                          "the null finding does not hold")
    return Comparison(True, gap - slack if gap else -math.inf, max_diff, "")


def printed_half_unit(value: Any) -> float:
    """Half a unit in the last printed digit, the coarsest over elements.

    The paper prints rounded numbers: 0.62 stands for anything in [0.615, 0.625)
    and 30 (percent) for anything in [29.5, 30.5).
    """
    flat = flatten(value) or []
    half = 0.0
    for x in flat:
        if isinstance(x, int):
            half = max(half, 0.5)
            continue
        exponent = Decimal(repr(float(x))).normalize().as_tuple().exponent
        # A float printed without decimals (4.0 from "4%") still carries a unit digit.
        digits = min(int(exponent), 0) if isinstance(exponent, int) else 0
        half = max(half, 0.5 * 10.0 ** digits)
    return half


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _fmt(x: float) -> str:
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.6g}"
