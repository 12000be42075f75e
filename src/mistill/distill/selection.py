"""The validation selection of the loss weight λ (App. I.3, I.4, M.2).

A grid of Mistill runs, λ_P1 = λ_P2 = λ, one seed, is evaluated on validation notes that no student
trains or is tested on. The rule, pre-registered in the paper and applied alike to every objective it
selects for (Mistill at bf16 and at fp32, the frozen RandHeads pool of M.2):

1. the cells within `band` of the best validation micro-F1 tie (inclusive: a gap equal to the band ties;
   App. M.2's gap of 0.00402 does not at 0.004, and does at 0.005, which turns Mistill's pick from 0.03 to 0.1);
2. among tied cells the higher M1 at P2C wins (the contrastive readout the method is for); a tie there
   goes to the smaller λ, the cell closer to the unsupervised recipe;
3. when the pick sits on the grid's edge, the grid takes one outward step along its own series and the
   rule is applied again to every cell (App. I.4: 0.03 at the edge of {0.03, 0.1, 0.3, 1} adds 0.01).

The grids are points of the 1-3 series (..., 0.01, 0.03, 0.1, 0.3, 1, 3, ...), the spacing of every
grid the paper ran; the outward step is the series' next point beyond the edge.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from mistill.errors import UserError

SERIES_MANTISSAS = (1, 3)   # the 1-3 series: {1, 3} x 10^e


@dataclass(frozen=True)
class Cell:
    """One grid point's validation readout."""

    lam: float
    micro_f1: float
    m1_p2c: float


def series_index(lam: float) -> int:
    """Position of λ on the 1-3 series (1 -> 0, 3 -> 1, 0.3 -> -1, 0.1 -> -2, ...); an error off the series."""
    if not (lam > 0 and math.isfinite(lam)):
        raise UserError(f"lambda {lam!r}: the selection grid takes positive lambdas")
    exponent = math.floor(math.log10(lam) + 1e-9)
    mantissa = lam / 10 ** exponent
    for i, m in enumerate(SERIES_MANTISSAS):
        if math.isclose(mantissa, m, rel_tol=1e-6):
            return 2 * exponent + i
    raise UserError(f"lambda {lam!r} is not on the 1-3 series (..., 0.03, 0.1, 0.3, 1, 3, ...) of the selection grids")


def series_value(index: int) -> float:
    exponent, i = divmod(index, 2)
    return float(f"{SERIES_MANTISSAS[i]}e{exponent}")   # 0.03, not 0.030000000000000002


def check_grid(lambdas: Sequence[float]) -> list[float]:
    """The grid sorted, checked: at least two points, distinct, contiguous on the series (an outward step is
    only defined for a grid without holes)."""
    grid = sorted(float(x) for x in lambdas)
    idx = [series_index(x) for x in grid]
    if len(grid) < 2 or len(set(idx)) != len(idx):
        raise UserError(f"selection grid {grid}: needs at least two distinct lambdas")
    if idx != list(range(idx[0], idx[0] + len(idx))):
        raise UserError(f"selection grid {grid}: not contiguous on the 1-3 series (a hole between "
                        f"{series_value(idx[0])} and {series_value(idx[-1])})")
    return grid


def tied(cells: Sequence[Cell], band: float) -> list[Cell]:
    """The cells within `band` (inclusive) of the best validation micro-F1."""
    if not cells:
        raise UserError("no grid cells to select from")
    if band < 0:
        raise UserError(f"tie band {band}: must be >= 0")
    best = max(c.micro_f1 for c in cells)
    # rounding before comparing: a gap equal to the band in print is a tie (0.183 - 0.179 at 0.004)
    return [c for c in cells if round(best - c.micro_f1, 12) <= band]


def pick(cells: Sequence[Cell], band: float) -> Cell:
    """Rules 1 and 2: the tied cell with the highest M1 at P2C, then the smallest λ."""
    return max(tied(cells, band), key=lambda c: (c.m1_p2c, -c.lam))


def outward_step(grid: Sequence[float], chosen: float) -> float | None:
    """Rule 3: the series' next λ beyond the grid's edge the pick sits on; None inside the grid."""
    grid = check_grid(grid)
    if math.isclose(chosen, grid[0]):
        return series_value(series_index(grid[0]) - 1)
    if math.isclose(chosen, grid[-1]):
        return series_value(series_index(grid[-1]) + 1)
    return None


def nearest_miss(cells: Sequence[Cell], band: float) -> Cell | None:
    """The cell outside the band closest to the best validation micro-F1 (App. M.2 reports its gap: the margin by
    which the band decided), or None when every cell ties."""
    inside = {c.lam for c in tied(cells, band)}
    outside = [c for c in cells if c.lam not in inside]
    return max(outside, key=lambda c: (c.micro_f1, -c.lam)) if outside else None
