"""Null intervals: a calibrated 95% interval of a difference whose golden contains zero is checked for still
containing zero (what it says), never for its ends; an interval that excludes zero keeps the tolerance rule."""

import pytest
import yaml

from mistill.cli import main
from mistill.errors import UserError
from mistill.repro.calibration import (
    CalibratedValue,
    Spread,
    calibrate,
    findings_table,
    remark_from_expected,
)
from mistill.repro.check import FAIL, PASS, run_check
from mistill.repro.registry import load_registry
from mistill.repro.tolerance import Tolerance, contains_zero, says_null
from tests.repro.repro_helpers import commit_all, write_fixture

KEY = "corpus_microf1_mistill_minus_bf16_vanilla_interval"   # R-D18's corpus-level bootstrap interval
GAIN = "qwen_note_clustered_p2c_gain_vs_bf16_interval"        # one that excludes zero at its golden


def test_an_interval_that_contains_zero_says_null():
    assert says_null(KEY, [-0.05, 0.06]) and says_null(KEY, [0.0, 0.2]) and says_null(KEY, [-0.2, 0.0])
    assert not says_null(KEY, [-0.37, -0.03])                   # excludes zero: a finding
    assert not says_null("corpus_microf1_mistill_minus_bf16_vanilla", [-0.05, 0.06])   # not an interval key
    assert not says_null(KEY, [-0.05, 0.01, 0.06]) and not says_null(KEY, 0.0)


def test_a_null_interval_passes_while_it_contains_zero_whatever_its_ends():
    golden = [-0.051, 0.060]
    assert contains_zero(golden, [-0.109, 0.017]).passed        # both ends moved by more than 0.049
    assert contains_zero(golden, [-0.3, 0.0]).passed
    fails = contains_zero(golden, [-0.109, -0.004])
    assert not fails.passed and "no longer contains 0" in fails.detail
    assert not contains_zero(golden, [0.02, -0.01]).passed      # not an interval
    assert not contains_zero(golden, [float("nan"), 0.1]).passed
    assert not contains_zero(golden, [-0.1]).passed             # another shape


def test_a_null_interval_may_leave_zero_by_the_tolerance_of_its_ends_and_no_further():
    """R-D18's SmolLM3 per-note interval (golden [-0.045, 0.013], calibrated tolerance 0.074): the held-out
    rerun put it at [-0.054, -0.0007], off zero by 0.0007, far inside the 0.074 its high end moves by."""
    golden, tol = [-0.045, 0.013], Tolerance(absolute=0.074)
    assert contains_zero(golden, [-0.054, -0.0007], tol).passed
    assert contains_zero(golden, [-0.2, -0.074], tol).passed               # at the edge
    below = contains_zero(golden, [-0.2, -0.08], tol)
    assert not below.passed and below.max_excess == pytest.approx(0.006)
    assert "off by 0.08, beyond its ends' tolerance 0.074" in below.detail
    assert contains_zero(golden, [0.07, 0.3], tol).passed                  # the low end's own slack
    assert not contains_zero(golden, [0.08, 0.3], tol).passed
    # a relative tolerance allows each end its own distance: 50% of 0.013 at the high end
    relative = Tolerance(relative=0.5)
    assert contains_zero(golden, [-0.1, -0.006], relative).passed
    assert not contains_zero(golden, [-0.1, -0.007], relative).passed
    # an interval-form tolerance (the paper's interval around a point) gives an interval no slack
    assert not contains_zero(golden, [-0.1, -0.0001], Tolerance(interval=(-0.1, 0.1))).passed


def test_calibrate_marks_a_moved_interval_that_contains_zero_as_null():
    def spread(key, golden, reps):
        return Spread("R-D18", key, golden, {f"r{i}": r for i, r in enumerate(reps)}, [0.012, 0.01], 0.012)

    spreads = [spread(KEY, [-0.051, 0.060], [[-0.06, 0.05], [-0.04, 0.07]]),
               spread(GAIN, [-0.37, -0.20], [[-0.36, -0.19], [-0.38, -0.21]])]
    kinds = {("R-D18", s.key): "share" for s in spreads}
    out = {c.key: c for c in calibrate(spreads, lambda k: 4.0, kinds)}
    assert out[KEY] == CalibratedValue("R-D18", KEY, 0.048, False, None, null_interval=True, multiple=4.0,
                                       replicates=("r0", "r1"), measured=0.048)
    assert not out[GAIN].null_interval and not out[GAIN].descriptive and out[GAIN].tolerance == 0.048


def test_an_interval_a_replicate_moves_off_zero_is_descriptive_not_null():
    """The golden contains zero, one replicate's interval does not: which of the two a machine shows is
    not settled, so the value is only described (the R-D24 uniform-versus-Mistill interval on the demo)."""
    spread = Spread("R-D24", KEY, [-0.023, 0.488], {"threads-1": [0.248, 0.672], "jitter-1": [-0.01, 0.5]},
                    [0.2, 0.15], 0.2)
    (out,) = calibrate([spread], lambda k: 4.0, {("R-D24", KEY): "share"})
    assert not out.null_interval and out.descriptive and out.range == [-1.0, 1.0]
    assert out.tolerance == 0.8


def _calibrated(git_root, values: dict[str, list[float]]) -> None:
    """R-D18 blessed at `values`, their tolerances then set as a calibration sets them (in git_root, the cwd)."""
    assert git_root.resolve() == git_root.cwd().resolve()
    results = git_root / "results"
    write_fixture(results, "R-D18", {k: {"value": v, "statistic": "95% interval", "artifact": "artifacts/M6"}
                                     for k, v in values.items()}, profile="demo")
    commit_all(git_root)
    assert main(["repro", "bless", "R-D18", "--profile", "demo", "--results", str(results),
                 "--accept-breach", "a test's own goldens"]) == 0
    path = results / "expected" / "demo.yaml"
    data = yaml.safe_load(path.read_text())
    for key in values:
        data["expected"]["R-D18"][key]["tolerance"] = {"absolute": 0.049, "basis": "calibrated: 4 x test"}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    commit_all(git_root)


def test_marks_only_then_check_then_rebless(git_root, monkeypatch):
    monkeypatch.chdir(git_root)
    _calibrated(git_root, {KEY: [-0.051, 0.060], GAIN: [-0.37, -0.06]})
    registry = load_registry(git_root)
    assert [(c.key, c.null_interval) for c in remark_from_expected(registry, "demo")] == [(KEY, True)]
    marked = load_registry(git_root).expected("demo").values["R-D18"]
    assert marked[KEY].null_interval_why and marked[KEY].held_to().startswith("null interval: contains 0")
    assert marked[GAIN].null_interval_why is None and marked[GAIN].descriptive is None   # 0.049 short of zero
    commit_all(git_root)
    assert remark_from_expected(load_registry(git_root), "demo") == []   # idempotent

    results = git_root / "results"

    def verdicts(interval, gain=(-0.37, -0.06)):
        write_fixture(results, "R-D18", {KEY: {"value": list(interval), "statistic": "s", "artifact": "a"},
                                         GAIN: {"value": list(gain), "statistic": "s", "artifact": "a"}},
                      profile="demo")
        return {ln.key: ln.verdict for ln in run_check(load_registry(git_root), "demo", results, ["R-D18"]).lines}

    assert verdicts([-0.109, 0.017])[KEY] == PASS                 # the second machine's: ends moved, still null
    assert verdicts([-0.109, -0.004])[KEY] == PASS                # off zero by less than its ends' 0.049
    assert verdicts([-0.2, -0.06])[KEY] == FAIL                   # a difference shown where the golden shows none
    assert verdicts([-0.109, 0.017], gain=(-0.37, 0.02))[GAIN] == FAIL   # the finding's end beyond its tolerance
    table = findings_table(load_registry(git_root), "demo", ("R-D18",))
    assert "a null finding (checked: the interval still contains zero, up to its ends' tolerance)" in table
    path = git_root / "results" / "expected" / "demo.yaml"       # a descriptive mark set by hand says its why
    data = yaml.safe_load(path.read_text())
    data["expected"]["R-D18"][GAIN]["descriptive"] = {"range": [-1.0, 1.0], "why": "not yet measured; later"}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    table = findings_table(load_registry(git_root), "demo", ("R-D18",))
    assert f"| R-D18 | `{GAIN}` |" in table and "| descriptive (not yet measured) |" in table
    commit_all(git_root)

    # a re-bless at an interval that still contains zero keeps the mark; one that excludes zero drops it
    for interval, kept in (([-0.02, 0.08], True), ([0.01, 0.09], False)):
        write_fixture(results, "R-D18", {KEY: {"value": interval, "statistic": "s", "artifact": "a"},
                                         GAIN: {"value": [-0.37, -0.06], "statistic": "s", "artifact": "a"}},
                      profile="demo")
        commit_all(git_root)
        assert main(["repro", "bless", "R-D18", "--profile", "demo", "--results", str(results),
                     "--accept-breach", "test"]) == 0
        assert (load_registry(git_root).expected("demo").values["R-D18"][KEY].null_interval_why is not None) == kept


def test_a_null_mark_on_an_interval_that_excludes_zero_is_refused(git_root, monkeypatch):
    monkeypatch.chdir(git_root)
    _calibrated(git_root, {GAIN: [-0.37, -0.03]})
    path = git_root / "results" / "expected" / "demo.yaml"
    data = yaml.safe_load(path.read_text())
    data["expected"]["R-D18"][GAIN]["null_interval"] = {"why": "by hand"}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(UserError, match="null_interval marks a golden"):
        load_registry(git_root).expected("demo")


def test_marks_only_makes_a_reblessed_golden_descriptive_where_its_kept_tolerance_reaches_zero(git_root, monkeypatch):
    """After a re-bless, calibrate()'s rule with the kept tolerance: a calibrated value whose golden now lies
    within its tolerance of zero is only described; marks are added, never taken away."""
    monkeypatch.chdir(git_root)
    near, far, listed = ("smollm_note_clustered_p2c_gain_vs_bf16", "qwen_note_clustered_p2c_higher_notes",
                         "smollm_corpus_microf1_mistill_minus_bf16_vanilla")
    _calibrated(git_root, {near: -0.03, far: 20, listed: -0.2, KEY: [-0.051, 0.060]})
    path = git_root / "results" / "expected" / "demo.yaml"
    data = yaml.safe_load(path.read_text())
    data["expected"]["R-D18"][listed]["descriptive"] = {"range": [-1.0, 1.0], "why": "an earlier calibration"}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    commit_all(git_root)

    marked = {c.key: c for c in remark_from_expected(load_registry(git_root), "demo")}
    assert set(marked) == {near, KEY}                             # 0.049 >= |-0.03|; 0.049 < 20
    assert marked[near].descriptive and not marked[near].null_interval and marked[near].range == [-1.0, 1.0]
    assert marked[KEY].null_interval and not marked[KEY].descriptive
    values = load_registry(git_root).expected("demo").values["R-D18"]
    assert values[near].descriptive == (-1.0, 1.0) and values[far].descriptive is None
    assert values[listed].descriptive_why == "an earlier calibration"   # kept, though 0.049 < 0.2 now
    commit_all(git_root)
    assert remark_from_expected(load_registry(git_root), "demo") == []   # idempotent

    write_fixture(git_root / "results", "R-D18", {
        near: {"value": 0.04, "statistic": "s", "artifact": "a"}, far: {"value": 26, "statistic": "s", "artifact": "a"},
        listed: {"value": 0.3, "statistic": "s", "artifact": "a"}, KEY: {"value": [-0.06, 0.07], "statistic": "s",
                                                                        "artifact": "a"}}, profile="demo")
    lines = {ln.key: ln.verdict for ln in run_check(load_registry(git_root), "demo", git_root / "results",
                                                    ["R-D18"]).lines}
    assert lines[near] == PASS and lines[listed] == PASS and lines[KEY] == PASS   # the sign flip is described
    assert lines[far] == FAIL                                                     # 26 is beyond 20 ± 0.049
