import math

import pytest

from mistill.errors import UserError
from mistill.repro.tolerance import Tolerance, compare, printed_half_unit


def test_absolute_boundary_is_inclusive_and_just_beyond_fails():
    tol = Tolerance(absolute=0.02)
    assert compare(0.62, 0.64, tol).passed
    assert compare(0.62, 0.60, tol).passed
    out = compare(0.62, 0.6401, tol)
    assert not out.passed and "off by 0.0201" in out.detail
    assert math.isclose(out.max_diff, 0.0201)


def test_relative_with_absolute_floor_takes_the_larger():
    tol = Tolerance(absolute=1, relative=0.05)
    assert compare(100, 105, tol).passed          # 5% of 100
    assert not compare(100, 106, tol).passed
    assert compare(10, 11, tol).passed            # floor of 1 beats 5% of 10
    assert not compare(10, 12, tol).passed


def test_interval_contains_and_excludes():
    tol = Tolerance(interval=(0.063, 0.101))
    assert compare(0.081, 0.063, tol).passed and compare(0.081, 0.101, tol).passed
    assert not compare(0.081, 0.102, tol).passed
    assert not compare(0.081, 0.0629, tol).passed


def test_exact_count_off_by_one_fails():
    tol = Tolerance(absolute=0)
    assert tol.exact and tol.describe() == "exact"
    assert compare(2064, 2064, tol).passed
    assert not compare(2064, 2065, tol).passed
    assert not compare(2064, 2063, tol).passed


def test_lists_compare_elementwise_and_name_the_breaching_element():
    tol = Tolerance(absolute=0.01)
    assert compare([0.731, 0.379, 0.721], [0.735, 0.375, 0.72], tol).passed
    out = compare([0.731, 0.379, 0.721], [0.731, 0.40, 0.721], tol)
    assert not out.passed and out.detail.startswith("[1] off by 0.021")
    nested = [[0.032, 0.051], [0.037, 0.057]]
    assert compare(nested, [[0.032, 0.05], [0.037, 0.057]], tol).passed


def test_shape_mismatch_and_non_numbers_fail():
    tol = Tolerance(absolute=1.0)
    assert "shape" in compare([1, 2], [1, 2, 3], tol).detail
    assert not compare([1, 2], 1, tol).passed
    assert not compare(1.0, float("nan"), tol).passed
    assert not compare(1.0, "1.0", tol).passed


def test_printed_half_unit_hand_worked():
    assert printed_half_unit(0.62) == pytest.approx(0.005)
    assert printed_half_unit(1.57) == pytest.approx(0.005)
    assert printed_half_unit(0.104) == pytest.approx(0.0005)
    assert printed_half_unit(30) == pytest.approx(0.5)           # "30%"
    assert printed_half_unit(4.0) == pytest.approx(0.5)          # "4%" transcribed as 4.0
    assert printed_half_unit([0.3, 1.79]) == pytest.approx(0.05)  # the coarsest element


def test_from_spec_rejects_bad_specs_in_one_line():
    good = Tolerance.from_spec({"absolute": 0.02, "relative": 0.05}, cls_name="K", where="x")
    assert good.allowed(1.0) == pytest.approx(0.05) and good.allowed(0.1) == pytest.approx(0.02)
    for bad in ({"absolute": -1}, {"interval": [2, 1]}, {"interval": [0, 1], "absolute": 0.1}, {"within": 3}, 0.1):
        with pytest.raises(UserError) as err:
            Tolerance.from_spec(bad, cls_name="K", where="R-C1.key")
        assert "\n" not in str(err.value) and str(err.value).startswith("R-C1.key")
