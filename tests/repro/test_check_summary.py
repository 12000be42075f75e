"""The check's summary line counts what its rows show: a malformed numbers file is an error, not a missing result."""

from mistill.cli import main
from mistill.repro.check import ERROR, run_check
from tests.repro.repro_helpers import REPO, paper_values, write_fixture


def test_a_malformed_numbers_file_is_counted_as_an_error(registry, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    (tmp_path / "R-C3.json").write_text("{truncated")
    write_fixture(tmp_path, "R-D1", paper_values(registry, "R-D1"))
    code = main(["repro", "check", "R-C3", "R-D1", "--profile", "paper", "--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "ERROR" in next(line for line in out.splitlines() if line.startswith("R-C3 "))
    assert out.splitlines()[-1] == (f"profile paper, {tmp_path}: 5 pass, 0 fail, 0 values not reproduced, "
                                    "0 without expected values, 1 errors, 0 results not reproduced (0 required) "
                                    "-> FAILED")


def test_file_and_value_errors_add_up(registry, tmp_path):
    (tmp_path / "R-C3.json").write_text("{truncated")
    write_fixture(tmp_path, "R-D1", paper_values(registry, "R-D1"), profile="demo")    # another profile's file
    values = paper_values(registry, "R-C4")
    values["l30h11_rank_p9"] = {"value": 1, "statistic": "rank of 1,600", "artifact": "fixture"}   # an unknown key
    write_fixture(tmp_path, "R-C4", values)
    report = run_check(registry, "paper", tmp_path, ["R-C3", "R-D1", "R-C4", "R-C9"])
    assert [(line.result_id, line.key) for line in report.lines if line.verdict == ERROR] == \
        [("R-C3", "*"), ("R-D1", "*"), ("R-C4", "l30h11_rank_p9")]
    assert "3 errors, 1 results not reproduced (1 required)" in report.summary()
