"""Tolerances from replicates: the spread, the rounding, the descriptive mark, and the check that uses them."""

import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from mistill.cli import main
from mistill.errors import UserError
from mistill.repro.calibration import (
    BREACHED,
    CLASS_HELD,
    DESCRIPTIVE_WHY,
    CalibratedValue,
    Spread,
    adopt_twins,
    apply_calibration,
    calibrate,
    family_multiple,
    findings_table,
    measure_spreads,
    rms_deviation,
    round_up,
    widen_ratio_ranges,
    write_spreads,
)
from mistill.repro.check import FAIL, PASS, run_check
from mistill.repro.registry import kind_range, load_registry
from mistill.repro.second_machine import unmeasured
from mistill.repro.tolerance import within_range
from tests.repro.repro_helpers import REPO, bless_demo, commit_all, write_fixture

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def test_rms_deviation_matches_numpy_per_element():
    golden = [0.5, -0.1]
    reps = [[0.6, 0.2], [0.4, -0.1], [0.55, -0.4], [0.5, 0.0]]
    expected = np.sqrt(np.mean((np.array(reps) - np.array(golden)) ** 2, axis=0))
    assert rms_deviation(golden, reps) == pytest.approx(expected.tolist(), rel=1e-12)
    # by hand: golden 1, replicates 1.1, 0.9, 1.2 -> sqrt((0.01 + 0.01 + 0.04) / 3) = sqrt(0.02)
    assert rms_deviation(1.0, [1.1, 0.9, 1.2]) == pytest.approx([math.sqrt(0.02)], rel=1e-12)


def test_rms_deviation_refuses_another_shape():
    with pytest.raises(UserError, match="shape"):
        rms_deviation([0.1, 0.2], [[0.1]])


@pytest.mark.parametrize(("x", "rounded"), [(0.01234, 0.013), (0.5, 0.5), (1234.0, 1300.0), (0.0990001, 0.1),
                                            (3e-7, 3e-7), (0.0, 0.0), (0.030000000000000002, 0.03)])
def test_round_up_keeps_two_significant_digits_and_never_rounds_down(x, rounded):
    assert round_up(x) == pytest.approx(rounded, rel=1e-12)
    assert round_up(x) >= x * (1 - 1e-12)       # never down, beyond float noise


def test_kind_ranges():
    assert kind_range("p_value", [0.3]) == [0.0, 1.0]
    assert kind_range("count", [4, 0]) == [0.0, math.inf]
    assert kind_range("share", [-0.2, 0.4]) == [-1.0, 1.0]
    assert kind_range("share", [1.1, 1.3]) == [-math.inf, math.inf]    # a ratio (perplexity), not a share
    assert kind_range("percent", [95.0, 107.0]) == [-math.inf, math.inf]
    lift = "mean over seeds of: M2 region lift of the own top-4 P2C heads, per seed"
    assert kind_range("share", [0.9987, 0.97], lift) == [-math.inf, math.inf]     # 1.004 on another machine
    assert kind_range("share", [0.9987, 0.97], "own-heads recovery at P2C") == [-1.0, 1.0]
    assert kind_range("count", [3, 4], "notes with a higher lift") == [0.0, math.inf]


def test_widen_ratio_ranges_unbounds_a_lift_marked_as_a_proportion():
    expected = {"R-D6": {
        "lift": {"kind": "share", "stat": "M2 region lift, median", "descriptive": {"range": [-1.0, 1.0]}},
        "recovery": {"kind": "share", "stat": "own-heads recovery", "descriptive": {"range": [-1.0, 1.0]}},
        "perplexity": {"kind": "share", "stat": "perplexity", "descriptive": {"range": [1.0, math.inf]}},
        "plain": {"kind": "share", "stat": "M2 region lift"}}}
    assert widen_ratio_ranges(expected) == [("R-D6", "lift")]
    assert expected["R-D6"]["lift"]["descriptive"]["range"] == [-math.inf, math.inf]
    assert expected["R-D6"]["recovery"]["descriptive"]["range"] == [-1.0, 1.0]
    assert expected["R-D6"]["perplexity"]["descriptive"]["range"] == [1.0, math.inf]


def _spread(key, golden, reps):
    rms = rms_deviation(golden, reps)
    return Spread("R-D6", key, golden, {f"r{i}": v for i, v in enumerate(reps)}, rms, max(rms))


def test_calibrate_marks_what_a_replicate_can_flip():
    spreads = [
        _spread("level", 0.71, [0.70, 0.72, 0.71, 0.715]),          # RMS 0.0075 -> 4x = 0.03: informative
        _spread("difference", -0.14, [0.05, -0.30, -0.10, 0.0]),    # the sign flips: descriptive
        _spread("untouched", 0.75, [0.75, 0.75, 0.75, 0.75]),       # no replicate moved it: left alone
    ]
    kinds = {("R-D6", s.key): "share" for s in spreads}
    out = {c.key: c for c in calibrate(spreads, lambda k: 4.0, kinds)}
    assert set(out) == {"level", "difference"}
    assert out["level"] == CalibratedValue("R-D6", "level", round_up(4 * spreads[0].spread), False, None,
                                           multiple=4.0, replicates=("r0", "r1", "r2", "r3"),
                                           measured=round_up(4 * spreads[0].spread))
    assert out["level"].tolerance == pytest.approx(0.03)
    assert out["difference"].descriptive and out["difference"].range == [-1.0, 1.0]
    # a floor the tolerance does not exceed keeps the present one: a calibration never narrows
    held = {c.key: c for c in calibrate(spreads, lambda k: 4.0, kinds, {("R-D6", "level"): 0.05})}["level"]
    assert held.tolerance is None and held.measured == pytest.approx(0.03) and not held.descriptive
    assert {c.key: c for c in calibrate(spreads, lambda k: 4.0, kinds, {("R-D6", "level"): 0.02})}[
        "level"].tolerance == pytest.approx(0.03)
    # a moved value whose kept (wider) tolerance reaches zero is descriptive all the same
    small = _spread("small difference", 0.001, [0.002, 0.0, 0.0015, 0.0005])
    (kept,) = calibrate([small], lambda k: 4.0, {("R-D6", "small difference"): "share"},
                        {("R-D6", "small difference"): 0.02})
    assert kept.tolerance is None and kept.descriptive and kept.range == [-1.0, 1.0]
    # a range holds the reference run's value too: a difference of recoveries it put below -1 is no proportion
    near = Spread("R-D30", "pair intervals", [-0.998, -0.59], {"r0": [-0.95, -0.5], "r1": [-0.99, -0.6]},
                  [0.03, 0.07], 0.07, reference=[-1.0037, -0.61])
    (unbounded,) = calibrate([near], lambda k: 20.0, {("R-D30", "pair intervals"): "share"})
    assert unbounded.descriptive and unbounded.range == [-math.inf, math.inf]


def test_the_multiple_is_the_student_t_quantile_of_a_family_wise_breach_chance():
    from scipy.stats import t

    assert family_multiple(0.05, 136, 5) == pytest.approx(t.ppf(1 - 0.05 / 272, df=5), rel=1e-12)
    assert family_multiple(0.05, 136, 5) == pytest.approx(8.514, abs=1e-3)
    assert family_multiple(0.05, 1, 5) == pytest.approx(2.5706, abs=1e-4)      # one value: the textbook t_5, 97.5%
    assert family_multiple(0.05, 300, 10) < family_multiple(0.05, 300, 5)       # each replicate more shrinks it
    assert family_multiple(0.05, 600, 5) > family_multiple(0.05, 300, 5)        # each value more widens it
    with pytest.raises(UserError, match="at least one element and one replicate"):
        family_multiple(0.05, 0, 5)


def _breach_chance(multiple: float, elements: int, replicates: int, *, shared_golden: bool, runs: int = 4000) -> float:
    """The chance that a fresh run breaches any of `elements` tolerances of `multiple` x the replicates' RMS
    deviation from the golden, each element of its own scale, simulated."""
    rng = np.random.default_rng(7)
    scale = rng.uniform(0.01, 1.0, size=elements)
    draws = rng.standard_normal((runs, elements, replicates + 2)) * scale[:, None]
    golden = draws[..., 0:1] if shared_golden else 0.0          # the golden a run of its own, or the value's mean
    deviations = draws[..., 1:] - golden
    rms = np.sqrt(np.mean(deviations[..., :-1] ** 2, axis=-1))
    return float(np.mean(np.any(np.abs(deviations[..., -1]) > multiple * rms, axis=-1)))


def test_a_family_wise_multiple_holds_a_whole_runs_breach_chance_where_a_flat_4_does_not():
    n, k, alpha = 136, 5, 0.05
    m = family_multiple(alpha, n, k)
    margin = 3 * math.sqrt(alpha * (1 - alpha) / 4000)
    exact = _breach_chance(m, n, k, shared_golden=False)         # the t model exactly: Bonferroni is near tight
    assert 1 - (1 - alpha / n) ** n - margin < exact < alpha + margin
    assert _breach_chance(m, n, k, shared_golden=True) < alpha + margin     # the golden's own offset: lighter tails
    assert _breach_chance(4.0, n, k, shared_golden=False) > 0.6             # 4 x RMS: most runs breach somewhere


def test_within_range_checks_shape_and_bounds_not_value():
    assert within_range(-0.14, 0.2, (-1.0, 1.0)).passed               # another sign: still produced, in range
    assert not within_range(-0.14, 1.5, (-1.0, 1.0)).passed
    assert not within_range(-0.14, float("nan"), (-1.0, 1.0)).passed
    assert not within_range([0.1, 0.2], [0.1], (-1.0, 1.0)).passed


def demo_values(**kv):
    return {k: {"value": v, "statistic": "share", "artifact": "artifacts/M6"} for k, v in kv.items()}


GOLDEN = {"untrained_qwen_own_p2c_k40": 0.71, "qwen_mistill_minus_fp32_vanilla_p2c": -0.14,
          "teacher_hd002_p2c_k40": 0.746}
REPLICATES = {"threads-1": (0.66, 0.05), "jitter-1": (0.76, -0.30), "jitter-2": (0.71, -0.10), "seed-1": (0.735, 0.0)}


def test_calibration_end_to_end_through_check_and_rebless(git_root, monkeypatch):
    """Goldens blessed, four replicates measured, tolerances applied: the check then holds a level to
    m_k x its RMS and a flippable difference only to its range, and a re-bless keeps both."""
    monkeypatch.chdir(git_root)
    results = git_root / "results"
    write_fixture(results, "R-D6", demo_values(**GOLDEN), profile="demo")
    assert main(["repro", "bless", "R-D6", "--profile", "demo", "--results", str(results)]) == 0
    registry = load_registry(git_root)
    dirs = []
    for name, (level, diff) in REPLICATES.items():
        d = git_root / "artifacts" / "CAL" / name
        write_fixture(d, "R-D6", demo_values(untrained_qwen_own_p2c_k40=level, qwen_mistill_minus_fp32_vanilla_p2c=diff,
                                             teacher_hd002_p2c_k40=0.746), profile="demo")
        (d / "replicate.json").write_text(json.dumps({"perturbation": name}))
        dirs.append(d)
    # an invariant (tolerance of its own, basis "invariant ...") keeps it, however the replicates move it
    demo_yaml = results / "expected" / "demo.yaml"
    data = yaml.load(demo_yaml.read_text(), Loader=LOADER)
    data["expected"]["R-D6"]["teacher_hd002_p2c_k40"]["tolerance"] = {"absolute": 0.5, "basis": "invariant: test"}
    demo_yaml.write_text(yaml.safe_dump(data, sort_keys=False))
    registry = load_registry(git_root)
    for d in dirs[:2]:
        values = {k: v["value"] for k, v in json.loads((d / "R-D6.json").read_text())["values"].items()}
        write_fixture(d, "R-D6", demo_values(**{**values, "teacher_hd002_p2c_k40": 0.9}), profile="demo")
    spreads = measure_spreads(registry, "demo", dirs, ("R-D6",))
    spread_path = git_root / "artifacts" / "CAL" / "spread.json"
    write_spreads(spread_path, spreads, dirs, 0.05)
    commit_all(git_root)
    multiple = family_multiple(0.05, 3, 4)                  # three moved elements, four replicates: 3.96

    applied = apply_calibration(registry, "demo", spread_path)
    assert {c.key for c in applied} == {"untrained_qwen_own_p2c_k40", "qwen_mistill_minus_fp32_vanilla_p2c"}
    data = yaml.load((results / "expected" / "demo.yaml").read_text(), Loader=LOADER)
    entries = data["expected"]["R-D6"]
    level_tol = round_up(multiple * math.sqrt(np.mean((np.array([0.66, 0.76, 0.71, 0.735]) - 0.71) ** 2)))
    assert level_tol == pytest.approx(0.15)                 # RMS 0.0375, above the class tolerance 0.0355
    assert entries["untrained_qwen_own_p2c_k40"]["tolerance"]["absolute"] == level_tol
    assert entries["untrained_qwen_own_p2c_k40"]["tolerance"]["basis"].startswith(
        "calibrated: 3.96 x the RMS deviation from the golden over 4 replicates (the Student-t quantile that holds a "
        "run's 3 calibrated elements to a chance of 0.05 of any breach): threads-1 (threads-1), jitter-1")
    assert data["meta"]["calibration"]["multiple"] == pytest.approx(multiple)
    assert "descriptive" not in entries["untrained_qwen_own_p2c_k40"]
    assert entries["qwen_mistill_minus_fp32_vanilla_p2c"]["descriptive"]["range"] == [-1.0, 1.0]
    assert entries["teacher_hd002_p2c_k40"]["tolerance"] == {"absolute": 0.5, "basis": "invariant: test"}
    assert "descriptive" not in entries["teacher_hd002_p2c_k40"]
    assert data["meta"]["calibration"]["spreads_sha256"]

    registry = load_registry(git_root)
    table = findings_table(registry, "demo", ("R-D6",)).splitlines()
    assert len(table) == 4                                  # header, rule, the two calibrated values
    assert f"| R-D6 | `untrained_qwen_own_p2c_k40` | 0.71 | [{0.71 - level_tol:.3g}, {0.71 + level_tol:.3g}] | a finding (the interval excludes zero) |" in table
    assert any("`qwen_mistill_minus_fp32_vanilla_p2c`" in row and "descriptive" in row for row in table)

    def verdicts(**values):
        write_fixture(results, "R-D6", demo_values(**{**GOLDEN, **values}), profile="demo")
        return {ln.key: ln.verdict for ln in run_check(load_registry(git_root), "demo", results, ["R-D6"]).lines}

    assert verdicts(qwen_mistill_minus_fp32_vanilla_p2c=0.2)["qwen_mistill_minus_fp32_vanilla_p2c"] == PASS
    assert verdicts(qwen_mistill_minus_fp32_vanilla_p2c=1.2)["qwen_mistill_minus_fp32_vanilla_p2c"] == FAIL
    assert verdicts(untrained_qwen_own_p2c_k40=0.71 + level_tol * 0.99)["untrained_qwen_own_p2c_k40"] == PASS
    assert verdicts(untrained_qwen_own_p2c_k40=0.71 + level_tol * 1.01)["untrained_qwen_own_p2c_k40"] == FAIL

    write_fixture(results, "R-D6", demo_values(**GOLDEN), profile="demo")
    commit_all(git_root)
    assert main(["repro", "bless", "R-D6", "--profile", "demo", "--results", str(results)]) == 0
    kept = load_registry(git_root).expected("demo").values["R-D6"]
    assert kept["qwen_mistill_minus_fp32_vanilla_p2c"].descriptive == (-1.0, 1.0)
    assert kept["untrained_qwen_own_p2c_k40"].tolerance.absolute == level_tol
    assert "descriptive in [-1, 1]" in (git_root / "REGISTRY.md").read_text()


@pytest.mark.parametrize("last_mark", [DESCRIPTIVE_WHY, f"{BREACHED}: calibrated to ±0.5, a run on x moved it by 0.7"])
def test_a_recalibration_forgets_the_last_one_and_a_second_machines_mark(git_root, monkeypatch, last_mark):
    """A value measured again is held to what the new spread asks, floored at its class tolerance and not
    at the last calibration's; the last calibration's marks and a second machine's ("not yet measured",
    "moved beyond the replicates' spread") go, a mark for another reason stays."""
    monkeypatch.chdir(git_root)
    demo_yaml = bless_demo(git_root, "R-D6", demo_values(**GOLDEN))
    data = yaml.load(demo_yaml.read_text(), Loader=LOADER)
    level, diff, teacher = (data["expected"]["R-D6"][key] for key in GOLDEN)
    level["tolerance"] = {"absolute": 0.5, "basis": "calibrated: 4 x an earlier spread"}
    level["descriptive"] = {"range": [-1.0, 1.0], "why": last_mark}
    diff["descriptive"] = {"range": [-1.0, 1.0], "why": "not yet measured by the replicates; a run on x moved it"}
    teacher["descriptive"] = {"range": [-1.0, 1.0], "why": "wall-clock time of the machine that ran it"}
    demo_yaml.write_text(yaml.safe_dump(data, sort_keys=False))
    moved = {"level": [0.711, 0.709, 0.71, 0.7105], "diff": [-0.13, -0.15, -0.14, -0.145], "teacher": [0.75] * 4}
    dirs = []
    for i, name in enumerate(REPLICATES):
        d = git_root / "artifacts" / "CAL" / name
        write_fixture(d, "R-D6", demo_values(untrained_qwen_own_p2c_k40=moved["level"][i],
                                             qwen_mistill_minus_fp32_vanilla_p2c=moved["diff"][i],
                                             teacher_hd002_p2c_k40=moved["teacher"][i]), profile="demo")
        (d / "replicate.json").write_text(json.dumps({"perturbation": name}))
        dirs.append(d)
    commit_all(git_root)
    spread_path = git_root / "artifacts" / "CAL" / "spread.json"
    write_spreads(spread_path, measure_spreads(load_registry(git_root), "demo", dirs, ("R-D6",)), dirs, 0.05)
    apply_calibration(load_registry(git_root), "demo", spread_path)

    entries = yaml.load(demo_yaml.read_text(), Loader=LOADER)["expected"]["R-D6"]
    level_rms = math.sqrt(np.mean((np.array(moved["level"]) - 0.71) ** 2))
    # within its class tolerance again, written out as measured by the replicates
    assert entries["untrained_qwen_own_p2c_k40"]["tolerance"] == {
        "absolute": 0.02, "relative": 0.05,
        "basis": f"{CLASS_HELD}, wider than {round_up(family_multiple(0.05, 3, 4) * level_rms):g} = 3.96 x the RMS "
                 f"deviation from the golden over 4 replicates (the Student-t quantile that holds a run's 3 calibrated "
                 f"elements to a chance of 0.05 of any breach): threads-1 (threads-1), jitter-1 (jitter-1), "
                 f"jitter-2 (jitter-2), seed-1 (seed-1)"}
    assert "descriptive" not in entries["untrained_qwen_own_p2c_k40"]
    held = load_registry(git_root).expected("demo").values["R-D6"]
    assert held["untrained_qwen_own_p2c_k40"].tolerance.allowed(0.71) == pytest.approx(0.0355)   # 5% of 0.71
    assert not unmeasured(held["untrained_qwen_own_p2c_k40"])     # measured: not a second machine's to mark
    diff_rms = math.sqrt(np.mean((np.array(moved["diff"]) + 0.14) ** 2))
    assert entries["qwen_mistill_minus_fp32_vanilla_p2c"]["tolerance"]["absolute"] == round_up(
        family_multiple(0.05, 3, 4) * diff_rms)
    assert "descriptive" not in entries["qwen_mistill_minus_fp32_vanilla_p2c"]    # measured now: a finding
    assert entries["teacher_hd002_p2c_k40"]["descriptive"]["why"].startswith("wall-clock")


def test_replicates_on_another_machine_are_measured_from_its_own_unperturbed_run(git_root, monkeypatch):
    """The spread of replicates run away from the goldens' machine is their RMS deviation from that machine's
    unperturbed run, not from the golden: the distance between the machines is left to test the tolerance."""
    monkeypatch.chdir(git_root)
    bless_demo(git_root, "R-D6", demo_values(**GOLDEN))
    reference = git_root / "calibration" / "machines" / "other" / "results"
    write_fixture(reference, "R-D6", demo_values(**{**GOLDEN, "untrained_qwen_own_p2c_k40": 0.80}), profile="demo")
    levels = [0.79, 0.81, 0.80, 0.805]
    dirs = []
    for level, name in zip(levels, REPLICATES):
        d = git_root / "artifacts" / "CAL" / name
        write_fixture(d, "R-D6", demo_values(**{**GOLDEN, "untrained_qwen_own_p2c_k40": level}), profile="demo")
        (d / "replicate.json").write_text(json.dumps({"perturbation": name, "cpu_type": "GenuineIntel family 6 model 207"}))
        dirs.append(d)
    registry = load_registry(git_root)
    key = "untrained_qwen_own_p2c_k40"
    (spread,) = [s for s in measure_spreads(registry, "demo", dirs, ("R-D6",), reference) if s.key == key]
    assert spread.rms == pytest.approx([math.sqrt(np.mean((np.array(levels) - 0.80) ** 2))], rel=1e-12)
    assert spread.golden == 0.71 and spread.reference == 0.80
    (from_golden,) = [s for s in measure_spreads(registry, "demo", dirs, ("R-D6",)) if s.key == key]
    assert from_golden.spread == pytest.approx(math.sqrt(np.mean((np.array(levels) - 0.71) ** 2)), rel=1e-12)
    write_spreads(git_root / "spread.json", [spread], dirs, 0.05, reference)
    assert json.loads((git_root / "spread.json").read_text())["reference"] == str(reference)

    (dirs[0] / "replicate.json").write_text(json.dumps({"perturbation": "threads-1", "cpu_type": "AuthenticAMD family 25"}))
    with pytest.raises(UserError, match="the replicates ran on CPUs of different types"):
        measure_spreads(registry, "demo", dirs, ("R-D6",), reference)
    with pytest.raises(UserError, match="no R-D6.json"):
        measure_spreads(registry, "demo", dirs[1:], ("R-D6",), git_root / "calibration")


def test_apply_tests_the_tolerances_on_the_reference_run_the_goldens_machine_did_not_make(git_root, monkeypatch,
                                                                                           capsys):
    """Replicates measured from another CPU's unperturbed run leave the distance between that CPU and the goldens'
    untouched by the sizing: `calibrate apply` checks the reference run against the new tolerances and fails on
    a breach, as it does for a held-out replicate."""
    monkeypatch.chdir(git_root)
    bless_demo(git_root, "R-D6", demo_values(**GOLDEN))
    reference = Path("calibration") / "machines" / "other" / "results"
    levels = [0.79, 0.81, 0.80, 0.805]                  # RMS 0.0075 about the reference's 0.80
    for name, level in zip(REPLICATES, levels):
        d = Path("artifacts") / "CAL" / name
        write_fixture(d, "R-D6", demo_values(**{**GOLDEN, "untrained_qwen_own_p2c_k40": level}), profile="demo")
        (d / "replicate.json").write_text(json.dumps({"perturbation": name, "cpu_type": "one CPU"}))
    replicates = {name: {"threads": 1} for name in REPLICATES}
    Path("params.yaml").write_text(yaml.safe_dump({"demo": {"calibration": {
        "scratch": "scratch", "out": "artifacts/CAL", "inputs": [], "stages": ["R-D6"], "results": ["R-D6"],
        "family_alpha": 0.05, "reference": str(reference), "replicates": replicates}}, "profile": "demo"}))
    dirs = [Path("artifacts") / "CAL" / name for name in REPLICATES]

    def apply_with_reference_at(level: float) -> int:
        write_fixture(reference, "R-D6", demo_values(**{**GOLDEN, "untrained_qwen_own_p2c_k40": level}), profile="demo")
        registry = load_registry(git_root)
        spreads = measure_spreads(registry, "demo", dirs, ("R-D6",), reference)
        write_spreads(Path("artifacts") / "CAL" / "spread.json", spreads, dirs, 0.05, reference)
        commit_all(git_root)
        return main(["repro", "calibrate", "apply"])

    # m_4 x RMS = 2.78 x 0.0075 for the one moved element, within its class tolerance 0.0355 about the golden
    # 0.71, which does not reach 0.80
    assert apply_with_reference_at(0.80) == 1
    out = capsys.readouterr().out
    assert f"the reference run {reference} (the replicates' CPU, not the goldens'): " in out
    assert "  R-D6.untrained_qwen_own_p2c_k40: FAIL" in out
    subprocess.run(["git", "checkout", "-q", "--", "results/expected/demo.yaml"], cwd=git_root, check=True)
    levels_about = [x - 0.09 for x in levels]           # the same spread about a reference at the golden
    for name, level in zip(REPLICATES, levels_about):
        write_fixture(Path("artifacts") / "CAL" / name, "R-D6",
                      demo_values(**{**GOLDEN, "untrained_qwen_own_p2c_k40": level}), profile="demo")
    assert apply_with_reference_at(0.71) == 0
    assert "FAIL" not in capsys.readouterr().out


def test_apply_refuses_spreads_measured_against_other_goldens(git_root, monkeypatch):
    monkeypatch.chdir(git_root)
    results = git_root / "results"
    write_fixture(results, "R-D6", demo_values(**GOLDEN), profile="demo")
    main(["repro", "bless", "R-D6", "--profile", "demo", "--results", str(results)])
    spread_path = git_root / "spread.json"
    spread_path.write_text(json.dumps({"family_alpha": 0.05, "elements": 1, "replicates": {"r": "x"}, "values": {"R-D6": {
        "untrained_qwen_own_p2c_k40": {"golden": 0.5, "replicates": {"r": 0.6}, "rms": [0.1], "spread": 0.1}}}}))
    commit_all(git_root)
    with pytest.raises(UserError, match="rerun the calibration"):
        apply_calibration(load_registry(git_root), "demo", spread_path)


def test_descriptive_needs_a_range(git_root):
    path = git_root / "results" / "expected" / "demo.yaml"
    path.write_text(yaml.safe_dump({"meta": {"profile": "demo", "blessable": True}, "expected": {"R-D6": {
        "teacher_hd002_p2c_k40": {"value": 0.7, "kind": "share", "descriptive": {"range": [1, -1]}}}}}))
    with pytest.raises(UserError, match="descriptive must be"):
        load_registry(git_root).expected("demo")


def test_a_per_seed_list_of_another_length_is_not_a_deviation(git_root, monkeypatch):
    """A replicate trained under another seed writes the per-seed list of its one seed: that list is
    left out of the value's spread (and named in the spread file), the other replicates size it."""
    monkeypatch.chdir(git_root)
    key = "qwen_vanilla_fp32_own_p2c_seeds"
    write_fixture(git_root / "results", "R-D6", demo_values(**GOLDEN, **{key: [0.5, 0.6, 0.7]}), profile="demo")
    assert main(["repro", "bless", "R-D6", "--profile", "demo", "--results", str(git_root / "results")]) == 0
    produced = {"threads-1": [0.52, 0.6, 0.66], "jitter-1": [0.5, 0.63, 0.7], "seed-1": [0.64]}
    dirs = []
    for name, seeds in produced.items():
        d = git_root / "artifacts" / "CAL" / name
        write_fixture(d, "R-D6", demo_values(**GOLDEN, **{key: seeds}), profile="demo")
        (d / "replicate.json").write_text(json.dumps({"perturbation": name}))
        dirs.append(d)
    spreads = {s.key: s for s in measure_spreads(load_registry(git_root), "demo", dirs, ("R-D6",))}
    per_seed = spreads[key]
    assert per_seed.other_shape == {"seed-1": [0.64]}
    assert set(per_seed.replicates) == {"threads-1", "jitter-1"}
    compared = np.array([produced["threads-1"], produced["jitter-1"]])
    assert per_seed.rms == pytest.approx(np.sqrt(((compared - [0.5, 0.6, 0.7]) ** 2).mean(axis=0)).tolist())
    assert spreads["untrained_qwen_own_p2c_k40"].other_shape == {}       # a scalar: every replicate counts
    write_spreads(git_root / "spread.json", list(spreads.values()), dirs, 0.05)
    written = json.loads((git_root / "spread.json").read_text())["values"]["R-D6"]
    assert written[key]["other_shape"] == {"seed-1": [0.64]} and "other_shape" not in written["untrained_qwen_own_p2c_k40"]


def test_a_value_takes_the_calibration_of_its_twin_the_same_number_in_another_result():
    basis = "calibrated: 4 x the RMS deviation from the golden over 5 replicates"
    seeds = [0.7423993130315085, 0.5333930030337269, 0.6738114006482422]
    expected = {
        "R-D6": {"own_seeds": {"value": seeds, "kind": "share", "tolerance": {"absolute": 0.15, "basis": basis}},
                 "seed_mean": {"value": 0.1234567891, "kind": "share", "tolerance": {"absolute": 0.26, "basis": basis},
                               "descriptive": {"range": [-1.0, 1.0], "why": "reaches zero"}},
                 "round": {"value": 0.5, "kind": "share", "tolerance": {"absolute": 0.1, "basis": basis}}},
        "R-D12": {"own_seeds": {"value": list(seeds), "kind": "share"},          # R-D6's number, read again
                  "spread": {"value": 0.2090059, "kind": "share"},               # its own statistic: untouched
                  "half": {"value": 0.5, "kind": "share"},                       # a round number: no twin
                  "counted": {"value": list(seeds), "kind": "count"}},           # another kind: not the same
        "R-D27": {"mean": {"value": 0.1234567891, "kind": "share"},
                  "own": {"value": 0.1234567891, "kind": "share", "tolerance": {"absolute": 0.3, "basis": "K: own"}}},
    }
    adopted = adopt_twins(expected)
    assert adopted == [("R-D12", "own_seeds", "R-D6", "own_seeds"), ("R-D27", "mean", "R-D6", "seed_mean")]
    twin = expected["R-D12"]["own_seeds"]
    assert twin["tolerance"]["absolute"] == 0.15 and twin["tolerance"]["basis"].startswith(
        "calibrated: the same number as R-D6.own_seeds")
    assert expected["R-D27"]["mean"]["descriptive"] == {"range": [-1.0, 1.0], "why": "reaches zero"}   # marks too
    assert "tolerance" not in expected["R-D12"]["spread"] and "tolerance" not in expected["R-D12"]["half"]
    assert "tolerance" not in expected["R-D12"]["counted"]
    assert expected["R-D27"]["own"]["tolerance"] == {"absolute": 0.3, "basis": "K: own"}
    # a new calibration moves the source: the twin follows it, never a twin of a twin
    expected["R-D6"]["own_seeds"]["tolerance"]["absolute"] = 0.2
    del expected["R-D6"]["seed_mean"]["descriptive"]
    assert adopt_twins(expected) == adopted
    assert twin["tolerance"]["absolute"] == 0.2 and "descriptive" not in expected["R-D27"]["mean"]


def test_the_committed_goldens_hold_a_number_to_one_tolerance_wherever_it_is_reported():
    """R-D12 reports R-D6's per-seed own-heads medians of the bf16 Vanilla students: both are held to one
    calibrated tolerance, above the class default of 0.02 (a Xeon moved two of those medians by 0.06)."""
    values = load_registry(REPO).expected("demo").values
    twin, first = values["R-D12"]["qwen_bf16_vanilla_own_p2c_seeds"], values["R-D6"]["qwen_vanilla_bf16_own_p2c_seeds"]
    assert twin.value == first.value
    assert twin.tolerance == first.tolerance and twin.tolerance.basis.startswith("calibrated")
    assert twin.tolerance.absolute > 0.06
    committed = (REPO / "results" / "expected" / "demo.yaml").read_text()
    data = yaml.load(committed, Loader=LOADER)["expected"]
    assert adopt_twins(data) and data == yaml.load(committed, Loader=LOADER)["expected"]   # applied already


def test_a_result_a_replicate_does_not_read_is_measured_over_the_others(git_root, monkeypatch):
    """A replicate's `not_read` results have no numbers file in its directory: their values' spreads are the
    other replicates' RMS deviation, over that many replicates."""
    monkeypatch.chdir(git_root)
    bless_demo(git_root, "R-D6", demo_values(**GOLDEN))
    levels = [0.69, 0.73, 0.70, 0.72]
    dirs = []
    for level, name in zip(levels, REPLICATES):
        d = git_root / "artifacts" / "CAL" / name
        write_fixture(d, "R-D6", demo_values(**{**GOLDEN, "untrained_qwen_own_p2c_k40": level}), profile="demo")
        dirs.append(d)
    (dirs[1] / "R-D6.json").unlink()                   # the seed-1 replicate of the demo leaves R-D12 so
    with pytest.raises(UserError, match=f"{dirs[1]}: no R-D6.json, and its replicate.json does not list"):
        measure_spreads(load_registry(git_root), "demo", dirs, ("R-D6",))    # an unfinished replicate
    (dirs[1] / "replicate.json").write_text(json.dumps({"perturbation": dirs[1].name,
                                                        "replicate": {"name": dirs[1].name, "not_read": ["R-D6"]}}))
    key = "untrained_qwen_own_p2c_k40"
    (spread,) = [s for s in measure_spreads(load_registry(git_root), "demo", dirs, ("R-D6",)) if s.key == key]
    kept = [levels[0]] + levels[2:]
    assert sorted(spread.replicates) == sorted(d.name for d in dirs if d != dirs[1])
    assert spread.spread == pytest.approx(math.sqrt(np.mean((np.array(kept) - 0.71) ** 2)), rel=1e-12)
