"""`mistill repro check` (what `nox -s check_tolerances` runs) on fixture numbers files in tmp_path."""

import pytest

from mistill.cli import main
from tests.repro.repro_helpers import REPO, paper_values, write_fixture


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)


def check(capsys, results, *args):
    code = main(["repro", "check", "--profile", "paper", "--results", str(results), *args])
    out, err = capsys.readouterr()
    return code, out, err


def line_of(out, rid, key):
    return next(line for line in out.splitlines() if line.startswith(f"{rid} ") and f" {key} " in line)


def test_within_tolerance_passes(registry, tmp_path, capsys):
    # 0.62 -> 0.64 is inside K's 0.02 (+0.005 printed rounding); everything else as printed.
    write_fixture(tmp_path, "R-C3", paper_values(registry, "R-C3", necessity_top8_p1=0.64))
    code, out, _ = check(capsys, tmp_path, "R-C3")
    assert code == 0
    assert "PASS" in line_of(out, "R-C3", "necessity_top8_p1")
    assert "36 pass, 0 fail" in out and out.rstrip().endswith("-> OK")


def test_breach_exits_non_zero_and_names_the_value(registry, tmp_path, capsys):
    write_fixture(tmp_path, "R-C3", paper_values(registry, "R-C3", knockin_top40_p2c=0.70))
    code, out, _ = check(capsys, tmp_path, "R-C3")
    assert code == 1
    line = line_of(out, "R-C3", "knockin_top40_p2c")
    assert "FAIL" in line and "0.85" in line and "0.7" in line and "off by 0.15" in line and " K " in line
    assert "1 fail" in out and out.rstrip().endswith("-> FAILED")


def test_exact_count_fails_on_off_by_one(registry, tmp_path, capsys):
    write_fixture(tmp_path, "R-C1", paper_values(registry, "R-C1", p1_event_count=2065))
    code, out, _ = check(capsys, tmp_path, "R-C1")
    assert code == 1
    line = line_of(out, "R-C1", "p1_event_count")
    assert "exact" in line and "FAIL" in line and "none" in line


def test_list_value_breach_names_the_element(registry, tmp_path, capsys):
    write_fixture(tmp_path, "R-D1", paper_values(registry, "R-D1", smollm3_3b_untrained_m1_p1_p2_p2c=[0.731, 0.5, 0.721]))
    code, out, _ = check(capsys, tmp_path, "R-D1")
    assert code == 1 and "[1] off by" in line_of(out, "R-D1", "smollm3_3b_untrained_m1_p1_p2_p2c")


def test_never_produced_is_not_reproduced_not_a_pass(registry, tmp_path, capsys):
    write_fixture(tmp_path, "R-C3", paper_values(registry, "R-C3"))
    code, out, _ = check(capsys, tmp_path, "R-C3", "R-C4")
    assert code == 1                                   # R-C4 was asked for and is absent
    assert "NOT REPRODUCED" in next(l for l in out.splitlines() if l.startswith("R-C4 "))
    assert "PASS" not in "".join(l for l in out.splitlines() if l.startswith("R-C4 "))


def test_restricting_to_produced_ids_passes(registry, tmp_path, capsys):
    write_fixture(tmp_path, "R-C3", paper_values(registry, "R-C3"))
    write_fixture(tmp_path, "R-D1", paper_values(registry, "R-D1"))
    code, out, _ = check(capsys, tmp_path, "R-C3", "R-D1")
    assert code == 0 and "41 pass" in out


def test_value_missing_from_a_produced_file_is_not_reproduced(registry, tmp_path, capsys):
    values = paper_values(registry, "R-C3")
    del values["knockin_top3_p1"]
    write_fixture(tmp_path, "R-C3", values)
    code, out, _ = check(capsys, tmp_path, "R-C3")
    assert code == 1 and "NOT REPRODUCED" in line_of(out, "R-C3", "knockin_top3_p1")


def test_full_demo_run_lists_unrequired_results_without_failing(registry, tmp_path, capsys):
    code = main(["repro", "check", "--profile", "demo", "--results", str(tmp_path)])
    out = capsys.readouterr().out
    required = [r for r in registry.results.values() if r.status == "demo"]
    assert code == (1 if required else 0)
    assert sum(1 for l in out.splitlines() if "NOT REPRODUCED" in l) == 62


def test_full_paper_run_fails_on_missing_paper_results(registry, tmp_path, capsys):
    code, out, _ = check(capsys, tmp_path)
    required = [r for r in registry.results.values() if r.status in registry.required_statuses("paper")]
    assert required and code == 1 and f"62 results not reproduced ({len(required)} required)" in out


def test_malformed_file_fails_with_one_clear_line(registry, tmp_path, capsys):
    (tmp_path / "R-C3.json").write_text("{truncated")
    write_fixture(tmp_path, "R-D1", paper_values(registry, "R-D1"))
    code, out, _ = check(capsys, tmp_path, "R-C3", "R-D1")
    assert code == 1
    bad = [l for l in out.splitlines() if l.startswith("R-C3 ")]
    assert len(bad) == 1 and "ERROR" in bad[0] and "malformed numbers file" in bad[0]


def test_numbers_of_another_profile_are_an_error(registry, tmp_path, capsys):
    write_fixture(tmp_path, "R-C3", paper_values(registry, "R-C3"), profile="demo")
    code, out, _ = check(capsys, tmp_path, "R-C3")
    assert code == 1 and "written under profile 'demo'" in out


def test_unknown_key_in_a_numbers_file_is_an_error(registry, tmp_path, capsys):
    values = paper_values(registry, "R-C3")
    values["knockin_top41_p1"] = {"value": 0.5, "statistic": "s", "artifact": "a"}
    write_fixture(tmp_path, "R-C3", values)
    code, out, _ = check(capsys, tmp_path, "R-C3")
    assert code == 1 and "ERROR" in line_of(out, "R-C3", "knockin_top41_p1")


def test_a_registered_key_beyond_the_papers_values_is_listed_not_failed(registry, tmp_path, capsys):
    """A paper-profile run writes registered keys the paper prints no value for (R-D1's Qwen3-4B M1, an
    invariant of the demo): reported as NO EXPECTED, never a failure (the rehearsal found it an ERROR)."""
    values = paper_values(registry, "R-D1")
    values["qwen3_4b_untrained_m1_p1_p2_p2c"] = {"value": [0.9, 0.8, 0.7], "statistic": "s", "artifact": "a"}
    write_fixture(tmp_path, "R-D1", values)
    code, out, _ = check(capsys, tmp_path, "R-D1")
    assert code == 0 and "NO EXPECTED" in line_of(out, "R-D1", "qwen3_4b_untrained_m1_p1_p2_p2c")
    assert "beyond the values paper is checked against" in out


def test_stray_numbers_file_for_unknown_id_fails_a_full_run(tmp_path, capsys):
    write_fixture(tmp_path, "R-C99", {"k": {"value": 1, "statistic": "s", "artifact": "a"}}, profile="demo")
    code = main(["repro", "check", "--profile", "demo", "--results", str(tmp_path)])
    assert code == 1 and "unknown result id" in capsys.readouterr().out


def test_unknown_id_on_the_command_line_is_one_line_exit_2(tmp_path, capsys):
    code, out, err = check(capsys, tmp_path, "R-C3", "R-Z1")
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and "unknown result id(s) R-Z1" in err
