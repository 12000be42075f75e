"""A second machine's run: values it moved that no replicate measured become descriptive; the rest keep their checks."""

import math
import shutil
import subprocess

import numpy as np
import pytest
import yaml

from mistill.cli import main
from mistill.errors import UserError
from mistill.repro.calibration import CALIBRATED, calibrated_multiple, findings_table
from mistill.repro.check import FAIL, PASS, run_check
from mistill.repro.numbers import read_numbers
from mistill.repro.registry import Expected, Registry, load_registry
from mistill.repro.second_machine import (
    DESCRIPTIVE,
    KEPT,
    NULL,
    MachineRun,
    apply_machine_run,
    breached_calibration,
    contradicted_null,
    judge,
    measure_moves,
)
from mistill.repro.tolerance import Tolerance, within_range
from tests.repro.repro_helpers import REPO, bless_demo, commit_all, md_cells, write_fixture

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
CLASS_TOL = Tolerance(absolute=0.02, relative=0.05, cls="T", basis="class default")


def expected(key, value, kind="share", tolerance=CLASS_TOL):
    return Expected("R-D7", key, value, "share", kind, "T", tolerance)


def test_judge_by_hand():
    # golden 0.5: the class tolerance allows max(0.02, 5% of 0.5) = 0.025
    kept = judge(expected("level", 0.5), 0.506, 4.0)                 # 4 x 0.006 = 0.024 <= 0.025
    assert (kept.outcome, kept.move, kept.allowed) == (KEPT, pytest.approx(0.006), pytest.approx(0.025))
    moved = judge(expected("level", 0.5), 0.507, 4.0)                # 4 x 0.007 = 0.028 > 0.025
    assert moved.outcome == DESCRIPTIVE and moved.range == [-1.0, 1.0]
    # per element, the widest move decides; the tightest element's tolerance is the one judged against
    listed = judge(expected("seeds", [0.1, 0.9]), [0.1, 0.904], 4.0)  # 4 x 0.004 <= min(0.02, 0.045)
    assert listed.outcome == KEPT and listed.allowed == pytest.approx(0.02)
    assert judge(expected("seeds", [0.1, 0.9]), [0.106, 0.9], 4.0).outcome == DESCRIPTIVE
    # an interval containing zero on both machines is a null interval; one that left zero is descriptive
    assert judge(expected("d_interval", [-0.1, 0.2]), [-0.05, 0.3], 4.0).outcome == NULL
    assert judge(expected("d_interval", [-0.1, 0.2]), [0.01, 0.3], 4.0).outcome == DESCRIPTIVE
    # a count: its range is [0, inf); an exact value moves out of its check by any amount
    count = judge(expected("notes", 19, kind="count", tolerance=Tolerance(cls="T")), 17, 4.0)
    assert count.outcome == DESCRIPTIVE and count.range == [0.0, math.inf]
    assert judge(expected("notes", 19, kind="count", tolerance=Tolerance(cls="T")), 19, 4.0).outcome == KEPT
    # not comparable: not numbers (a list of another length is described at any length: the next test)
    assert judge(expected("seeds", [0.1, 0.9]), [0.1, "x"], 4.0) is None
    assert judge(expected("level", 0.5), "n/a", 4.0) is None


def test_a_null_interval_the_other_machine_moved_off_zero_becomes_descriptive():
    calibrated = Tolerance(absolute=0.26, cls="T", basis="calibrated: 4 x test")
    null = Expected("R-D25", "d_interval", [-0.006, 0.282], "95% interval", "share", "T", calibrated,
                    null_interval_why="contains zero")
    off = contradicted_null(null, [0.27, 0.55])                        # off zero by more than lo's 0.26
    assert off.outcome == DESCRIPTIVE and off.off_zero and off.range == [-1.0, 1.0]
    assert off.move == pytest.approx(0.276)
    # the Xeon run of R-D25, off zero by 0.009: well inside the machine noise of its low end, still null
    assert contradicted_null(null, [0.009, 0.306]) is None
    assert contradicted_null(null, [-0.02, 0.31]) is None              # still contains zero: stays null
    assert contradicted_null(expected("d_interval", [-0.1, 0.2]), [0.01, 0.3]) is None   # never marked null
    assert contradicted_null(null, [0.1]) is None                      # not comparable


def test_a_calibrated_value_the_other_machine_breaches_becomes_descriptive():
    calibrated = Tolerance(absolute=0.03, cls="T", basis="calibrated: 12 x the RMS deviation of five replicates")
    level = Expected("R-D6", "smollm_mistill_own_p2c_seeds", [0.057, 0.2, 0.31], "share", "share", "T", calibrated)
    breached = breached_calibration(level, [-0.062, 0.21, 0.3])          # seed 0 moved 0.119 > 0.03
    assert breached.outcome == DESCRIPTIVE and breached.breached and breached.measured
    assert (breached.move, breached.allowed, breached.range) == (pytest.approx(0.119), 0.03, [-1.0, 1.0])
    assert breached_calibration(level, [0.08, 0.18, 0.33]) is None        # every element within 0.03: still a number
    # only a calibrated number is judged: a class tolerance is the unmeasured rule's, a mark is kept as it is
    assert breached_calibration(expected("level", 0.5), 0.9) is None
    described = Expected("R-D6", "x", 0.5, "share", "share", "T", calibrated, descriptive=(-1.0, 1.0))
    assert breached_calibration(described, 0.9) is None
    null = Expected("R-D6", "d_interval", [-0.1, 0.2], "95% interval", "share", "T", calibrated,
                    null_interval_why="contains zero")
    assert breached_calibration(null, [0.5, 0.9]) is None                 # contradicted_null's to judge
    assert breached_calibration(level, [0.1, 0.2]) is None                # not comparable
    assert breached_calibration(Expected("R-D6", "y", 0.4, "share", "share", "T", calibrated), 0.5).breached  # a scalar


def test_one_run_cannot_size_a_tolerance():
    """The docstring's figure: with iid deviations, P(|third| > m |one run|) = (2/pi) arctan(1/m)."""
    rng = np.random.default_rng(0)
    one, third = rng.standard_normal((2, 400_000))
    for m in (1.0, 4.0, 10.0):
        assert np.mean(np.abs(third) > m * np.abs(one)) == pytest.approx(2 / math.pi * math.atan(1 / m), abs=0.003)
    assert 2 / math.pi * math.atan(1 / 4) == pytest.approx(0.156, abs=0.001)     # "about one in six"


def _demo(**kv):
    return {k: {"value": v, "statistic": "share", "artifact": "artifacts/M6"} for k, v in kv.items()}


GOLDEN = {"qwen_randpos_own_p2c": 0.42, "randboth_minus_randpos": 0.31, "randboth_minus_randpos_interval": [-0.05, 0.6],
          "qwen_untrained_own_p2c": 0.71, "calibrated_level": 0.4, "calibrated_breached": 0.4}
OTHER = {"qwen_randpos_own_p2c": 0.124, "randboth_minus_randpos": 0.53, "randboth_minus_randpos_interval": [-0.01, 0.7],
         "qwen_untrained_own_p2c": 0.71 + 1e-7, "calibrated_level": 0.1, "calibrated_breached": 0.1}


def _machine(root, values):
    run = root / "calibration" / "machines" / "other-cpu"
    write_fixture(run / "results", "R-D7", _demo(**values), profile="demo")
    (run / "machine.yaml").write_text(yaml.safe_dump({"cpu": "another CPU", "code_version": "abc", "command": "nox"}))
    return MachineRun.load(run)


def test_machine_run_end_to_end_through_check_and_rebless(git_root, monkeypatch):
    monkeypatch.chdir(git_root)
    results = git_root / "results"
    demo_yaml = bless_demo(git_root, "R-D7", _demo(**GOLDEN))
    data = yaml.load(demo_yaml.read_text(), Loader=LOADER)
    data["expected"]["R-D7"]["calibrated_level"]["tolerance"] = {"absolute": 0.5, "basis": "calibrated: test"}
    data["expected"]["R-D7"]["calibrated_breached"]["tolerance"] = {"absolute": 0.2, "basis": "calibrated: test"}
    demo_yaml.write_text(yaml.safe_dump(data, sort_keys=False))
    run = _machine(git_root, OTHER)
    registry = load_registry(git_root)
    assert run_check(registry, "demo", run.results, ["R-D7"]).failed      # the class tolerances do not hold there
    commit_all(git_root)

    moves = {m.key: m for m in apply_machine_run(registry, "demo", run, 4.0)}
    assert {k: m.outcome for k, m in moves.items()} == {
        "qwen_randpos_own_p2c": DESCRIPTIVE, "randboth_minus_randpos": DESCRIPTIVE,
        "randboth_minus_randpos_interval": NULL, "qwen_untrained_own_p2c": KEPT,
        "calibrated_breached": DESCRIPTIVE}              # a calibrated value is judged only where it is breached
    entries = yaml.load(demo_yaml.read_text(), Loader=LOADER)
    marked = entries["expected"]["R-D7"]
    assert marked["qwen_randpos_own_p2c"]["descriptive"]["range"] == [-1.0, 1.0]
    assert "moved it by 0.296" in marked["qwen_randpos_own_p2c"]["descriptive"]["why"]
    assert "null_interval" in marked["randboth_minus_randpos_interval"]
    assert "descriptive" not in marked["qwen_untrained_own_p2c"] and "descriptive" not in marked["calibrated_level"]
    assert marked["calibrated_breached"]["descriptive"]["why"].startswith(
        "a CPU change moved it beyond the replicates' spread: calibrated to ±0.2, a run on other-cpu (another CPU) "
        "moved it by 0.3")
    assert marked["calibrated_breached"]["tolerance"]["basis"] == "calibrated: test"   # a re-calibration drops both
    assert entries["meta"]["machines"]["other-cpu"]["cpu"] == "another CPU"
    assert entries["meta"]["machines"]["other-cpu"]["results"] == "calibration/machines/other-cpu/results"

    registry = load_registry(git_root)
    assert not run_check(registry, "demo", run.results, ["R-D7"]).failed   # the other machine's run now passes
    rows = {md_cells(row)[1]: md_cells(row)[4] for row in
            findings_table(registry, "demo", ("R-D7",), every=True).splitlines()[2:]}
    assert rows["`qwen_randpos_own_p2c`"].startswith("descriptive (not yet measured by the replicates")
    assert rows["`randboth_minus_randpos_interval`"].startswith("a null finding")
    assert rows["`qwen_untrained_own_p2c`"] == "a number held to its tolerance (±max(0.02, 5%))"
    assert rows["`calibrated_level`"] == "a finding (the interval excludes zero)"
    assert rows["`calibrated_breached`"].startswith("descriptive (a CPU change moved it beyond the replicates' spread")
    assert len(findings_table(registry, "demo", ("R-D7",)).splitlines()) == 2 + 5   # without `every`: no kept value
    assert not run_check(registry, "demo", results, ["R-D7"]).failed       # and so does the goldens' run

    def verdicts(**values):
        write_fixture(results, "R-D7", _demo(**{**GOLDEN, **values}), profile="demo")
        return {ln.key: ln.verdict for ln in run_check(load_registry(git_root), "demo", results, ["R-D7"]).lines}

    assert verdicts(qwen_randpos_own_p2c=0.9)["qwen_randpos_own_p2c"] == PASS              # described, in range
    assert verdicts(qwen_randpos_own_p2c=1.5)["qwen_randpos_own_p2c"] == FAIL              # out of a share's range
    assert verdicts(qwen_untrained_own_p2c=0.8)["qwen_untrained_own_p2c"] == FAIL          # kept: still a number
    assert verdicts(randboth_minus_randpos_interval=[0.1, 0.7])["randboth_minus_randpos_interval"] == FAIL

    write_fixture(results, "R-D7", _demo(**GOLDEN), profile="demo")
    commit_all(git_root)
    assert main(["repro", "bless", "R-D7", "--profile", "demo", "--results", str(results)]) == 0
    kept = load_registry(git_root).expected("demo").values["R-D7"]
    assert kept["qwen_randpos_own_p2c"].descriptive == (-1.0, 1.0)
    commit_all(git_root)
    before = demo_yaml.read_text()
    again = apply_machine_run(load_registry(git_root), "demo", run, 4.0)     # marked values are not judged twice
    assert {m.key for m in again} == {"qwen_untrained_own_p2c"}
    assert demo_yaml.read_text() == before                                  # nothing new: the file is untouched


def test_machine_run_refuses_bad_input(tmp_path, git_root, monkeypatch):
    monkeypatch.chdir(git_root)
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(UserError, match="machine.yaml"):
        MachineRun.load(run)
    (run / "machine.yaml").write_text("cpu: x\n")
    with pytest.raises(UserError, match="code_version, command"):
        MachineRun.load(run)
    (run / "machine.yaml").write_text("cpu: x\ncode_version: y\ncommand: z\n")
    with pytest.raises(UserError, match="no numbers files"):
        MachineRun.load(run)
    write_fixture(run / "results", "R-D7", _demo(**GOLDEN), profile="paper")
    write_fixture(git_root / "results", "R-D7", _demo(**GOLDEN), profile="demo")
    commit_all(git_root)
    assert main(["repro", "bless", "R-D7", "--profile", "demo", "--results", str(git_root / "results")]) == 0
    with pytest.raises(UserError, match="profile 'paper', not 'demo'"):
        measure_moves(load_registry(git_root), "demo", MachineRun.load(run), 4.0)


def goldens_when_applied(run_name: str, tmp_path) -> Registry:
    """The registry with the demo's expected values the machine run `run_name` was last checked against (its
    machine.yaml names the commit, `goldens_commit`): a run is evidence about the goldens of its own chain,
    and a later re-bless from another chain (another retriever) leaves it behind."""
    record = yaml.safe_load((REPO / "calibration" / "machines" / run_name / "machine.yaml").read_text())
    applied = record["goldens_commit"]
    shown = subprocess.run(["git", "-C", str(REPO), "show", f"{applied}:results/expected/demo.yaml"],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        pytest.skip(f"commit {applied[:8]} is not in this clone's history (a shallow clone)")
    (tmp_path / "results" / "expected").mkdir(parents=True)
    shutil.copy(REPO / "registry.yaml", tmp_path / "registry.yaml")
    shutil.copy(REPO / "results" / "expected" / "paper.yaml", tmp_path / "results" / "expected" / "paper.yaml")
    (tmp_path / "results" / "expected" / "demo.yaml").write_text(shown.stdout)
    return load_registry(tmp_path)


def test_the_committed_second_machine_run_passes_the_checks_it_was_applied_to(tmp_path):
    """The run on another CPU type (calibration/machines) holds against the expected values it was applied to:
    every value it moved beyond a quarter of its tolerance carried its mark then, and carries it still, so a
    re-bless cannot silently drop one. A mark lasts until the replicates measure the value (second_machine's
    rule): a value that now carries a calibrated tolerance has left it for a measured one."""
    run = MachineRun.load(REPO / "calibration" / "machines" / "xeon-avx512-amx")
    then = goldens_when_applied("xeon-avx512-amx", tmp_path)
    report = run_check(then, "demo", run.results)
    assert not report.failed, [f"{ln.result_id}.{ln.key}: {ln.detail}" for ln in report.lines if ln.fails]
    assert [m for m in measure_moves(then, "demo", run, 4.0) if m.outcome != KEPT] == []
    now = load_registry(REPO).expected("demo").values
    marked_then = [(rid, key) for rid, keys in then.expected("demo").values.items() for key, exp in keys.items()
                   if exp.descriptive is not None or exp.null_interval_why is not None]
    assert marked_then
    dropped = [(rid, key) for rid, key in marked_then if key in now.get(rid, {})
               and now[rid][key].descriptive is None and now[rid][key].null_interval_why is None
               and (then.expected("demo").values[rid][key].descriptive is not None)
               and not now[rid][key].tolerance.basis.startswith(CALIBRATED)]
    assert dropped == []


def test_the_fresh_clone_on_another_cpu_passes_every_required_value_it_was_checked_against(tmp_path):
    """The fresh clone's whole `nox -s repro` on the Intel Xeon (calibration/machines/xeon-amx-fresh-clone),
    checked against the goldens of the AMD EPYC and never applied to them: every required result is there and
    every value passes."""
    run = MachineRun.load(REPO / "calibration" / "machines" / "xeon-amx-fresh-clone")
    then = goldens_when_applied("xeon-amx-fresh-clone", tmp_path)
    report = run_check(then, "demo", run.results)
    assert not report.failed, [f"{ln.result_id}.{ln.key}: {ln.detail}" for ln in report.lines if ln.fails]
    assert report.count(PASS) == sum(len(keys) for keys in then.expected("demo").values.values())


def test_two_runs_on_one_cpu_type_agree_bit_for_bit_but_for_the_machine_s_own_measures():
    """The chain is deterministic on one CPU type: the two committed Xeon runs (two clones, two commits, a day
    apart) hold equal numbers for every value they share, except R-D9's, which reads the runs' wall-clock
    times and peak memory."""
    machine_measures = {"R-D9"}
    runs = [MachineRun.load(REPO / "calibration" / "machines" / name) for name in
            ("xeon-amx-minilm", "xeon-amx-fresh-clone")]
    registry = load_registry(REPO)
    first, second = ({path.stem: read_numbers(path, registry).values for path in run.results.glob("R-*.json")}
                     for run in runs)
    shared = [(rid, key) for rid in first.keys() & second.keys() for key in first[rid].keys() & second[rid].keys()]
    assert len(shared) > 1000
    differ = sorted({rid for rid, key in shared if first[rid][key]["value"] != second[rid][key]["value"]})
    assert differ == sorted(machine_measures)


def test_a_list_of_another_length_is_described_at_any_length():
    walk = expected("val_lambdas", [0.1, 0.3, 1.0, 3.0], kind="quantity")
    moved = judge(walk, [0.3, 1.0, 3.0], 4.0)
    assert moved.outcome == DESCRIPTIVE and moved.any_length and moved.range == [-math.inf, math.inf]
    assert judge(expected("nested", [[0.1], [0.2]]), [[0.1]], 4.0) is None     # only flat lists
    bounded = Expected("R-D31", "cells", [0.42, 0.43], "share", "share", "T", CLASS_TOL, descriptive=(-1.0, 1.0),
                       descriptive_any_length=True)
    assert "any length" in bounded.held_to()
    assert within_range(bounded.value, [0.35, 0.41, 0.39], bounded.descriptive, any_length=True).passed
    assert not within_range(bounded.value, [0.35, 1.41, 0.39], bounded.descriptive, any_length=True).passed
    assert not within_range(bounded.value, [], bounded.descriptive, any_length=True).passed
    assert not within_range(bounded.value, [0.35, 0.41, 0.39], bounded.descriptive).passed   # without: same shape


def test_descriptive_length_must_be_any(git_root):
    path = git_root / "results" / "expected" / "demo.yaml"
    path.write_text(yaml.safe_dump({"meta": {"profile": "demo", "blessable": True}, "expected": {"R-D31": {
        "val_lambdas_mistill": {"value": [0.1, 0.3], "kind": "quantity",
                                "descriptive": {"range": [0, 10], "length": 3}}}}}))
    with pytest.raises(UserError, match="length must be 'any'"):
        load_registry(git_root).expected("demo")


def test_the_margin_is_the_multiple_the_goldens_calibration_applied(git_root):
    path = git_root / "results" / "expected" / "demo.yaml"
    path.write_text(yaml.safe_dump({"meta": {"profile": "demo", "blessable": True}, "expected": {}}))
    with pytest.raises(UserError, match="records no calibration: run `mistill repro calibrate apply` first"):
        calibrated_multiple(load_registry(git_root), "demo")
    calibration = {"family_alpha": 0.05, "elements": 253, "multiple": 9.7017}
    path.write_text(yaml.safe_dump({"meta": {"profile": "demo", "blessable": True, "calibration": calibration},
                                    "expected": {}}))
    assert calibrated_multiple(load_registry(git_root), "demo") == 9.7017
