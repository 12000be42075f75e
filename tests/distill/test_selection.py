"""The validation λ selection rule (App. I.3, I.4, M.2) on the paper's own worked cases."""

import pytest

from mistill.distill.selection import (
    Cell,
    check_grid,
    nearest_miss,
    outward_step,
    pick,
    series_index,
    series_value,
    tied,
)
from mistill.errors import UserError


def test_series_round_trips_the_paper_grids():
    for lam in (0.01, 0.03, 0.1, 0.3, 1, 3):
        assert series_value(series_index(lam)) == lam
    assert [series_index(x) for x in (0.1, 0.3, 1, 3)] == [-2, -1, 0, 1]
    with pytest.raises(UserError, match="1-3 series"):
        series_index(0.2)
    with pytest.raises(UserError, match="not contiguous"):
        check_grid([0.03, 0.3, 1])


def test_outward_step_at_either_edge_only():
    assert outward_step([0.03, 0.1, 0.3, 1], 0.03) == 0.01   # App. I.4: the fp32 pick at the edge adds 0.01
    assert outward_step([0.3, 1, 3], 0.3) == 0.1              # the pre-registered grid extended down to 0.1 (I.3)
    assert outward_step([0.03, 0.1, 0.3], 0.3) == 1           # App. M.2: RandHeads' pick at 0.3 adds 1
    assert outward_step([0.03, 0.1, 0.3], 0.1) is None


def test_fp32_reselection_tie_broken_by_m1():
    # App. I.4: 0.183 at λ=0.01 against 0.181 at 0.03, a tie within 0.004 that M1 at P2C breaks
    cells = [Cell(0.01, 0.183, 0.80), Cell(0.03, 0.181, 0.82), Cell(0.1, 0.161, 0.83)]
    assert [c.lam for c in tied(cells, 0.004)] == [0.01, 0.03]
    assert pick(cells, 0.004).lam == 0.03
    assert pick(cells, 0.0).lam == 0.01      # no band: the best micro-F1 alone


def test_matched_selection_band_sensitivity():
    # App. M.2: Mistill's 0.1 trails 0.03 by 0.0040204, outside a 0.004 band and inside 0.005
    cells = [Cell(0.03, 0.1500204, 0.70), Cell(0.1, 0.146, 0.75), Cell(0.3, 0.12, 0.9)]
    assert pick(cells, 0.004).lam == 0.03
    assert pick(cells, 0.005).lam == 0.1
    # the margin App. M.2 reports: the nearest cell outside the band, 0.1, behind the best by 0.0040204
    assert nearest_miss(cells, 0.004).lam == 0.1
    assert 0.1500204 - nearest_miss(cells, 0.004).micro_f1 == pytest.approx(0.0040204)
    assert nearest_miss(cells, 0.005).lam == 0.3
    assert nearest_miss(cells, 1.0) is None   # every cell ties


def test_band_is_inclusive_at_printed_precision():
    cells = [Cell(0.1, 0.183, 0.5), Cell(0.3, 0.179, 0.6)]   # a gap of 0.004 in print, 0.00400000000000001 in floats
    assert pick(cells, 0.004).lam == 0.3


def test_equal_m1_goes_to_the_smaller_lambda():
    cells = [Cell(1.0, 0.2, 0.9), Cell(0.3, 0.2, 0.9)]
    assert pick(cells, 0.0).lam == 0.3
    with pytest.raises(UserError):
        pick([], 0.004)
    with pytest.raises(UserError):
        pick(cells, -0.1)
