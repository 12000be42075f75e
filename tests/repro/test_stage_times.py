"""Stage wall times: recorded by the entry point under DVC, read back as each stage's latest run."""

import json

import pytest

from mistill.cli import main
from mistill.repro import stage_times as st


def _line(stage, wall, cpu=1.0, started="2026-12-01T00:00:00+00:00"):
    return {"stage": stage, "command": "x y", "started": started, "wall_s": wall, "cpu_s": cpu, "threads": 2}


def test_a_stage_is_its_last_contiguous_block_in_the_order_it_ran():
    lines = [_line("inventory", 1.0), _line("EV@a", 2.0), _line("EV@a", 3.0), _line("R-D1", 0.5),
             _line("inventory", 4.0),                      # re-run: replaces the first run, moves to the end
             _line("EV@a", 10.0)]                          # re-run of a two-command stage with one command
    times = st.latest_runs(lines)
    assert [t.stage for t in times] == ["R-D1", "inventory", "EV@a"]
    assert {t.stage: (t.commands, t.wall_s) for t in times} == {"R-D1": (1, 0.5), "inventory": (1, 4.0),
                                                                 "EV@a": (1, 10.0)}
    two = st.latest_runs(lines[:4])
    assert {t.stage: (t.commands, t.wall_s, t.cpu_s) for t in two}["EV@a"] == (2, 5.0, 2.0)


def test_family_table_sums_matrix_items_and_totals():
    times = st.latest_runs([_line("DT-000@qwen-bf16-0", 30.0), _line("DT-000@smol-bf16-0", 10.0),
                            _line("R-D6", 15.0, cpu=0.5), _line("R-C12", 5.0), _line("R-D6-extra", 20.0)])
    table = st.markdown_table(times, by_family=True).splitlines()
    assert table[2] == "| DT-000 | 2 | 40.0 | 50% | 2.0 |"
    assert table[3] == "| readers (R-C*, R-D*) | 2 | 20.0 | 25% | 1.5 |"     # results' readers summed
    assert table[4] == "| R-D6-extra | 1 | 20.0 | 25% | 1.0 |"
    assert table[-1] == "| **total** | 5 | **80.0** (1.3 min) | 100% | 4.5 |"
    assert "| R-D6 | 15.0 | 19% | 0.5 |" in st.markdown_table(times)     # per stage: each reader


def test_between_stages_is_the_gaps_from_each_end_to_the_next_start():
    times = st.latest_runs([_line("inventory", 2.0, started="2026-12-01T00:00:00.000+00:00"),
                            _line("EV@a", 5.0, started="2026-12-01T00:00:10.500+00:00"),    # gap 8.5
                            _line("EV@a", 1.0, started="2026-12-01T00:00:15.600+00:00"),    # same stage
                            _line("R-D1", 0.5, started="2026-12-01T00:00:20.000+00:00"),    # gap 20 - (10.5 + 6)
                            _line("R-D2", 0.5, started="2026-12-01T01:00:00+00:00"),        # another repro
                            _line("R-D5", 3.0, started="2026-12-01T01:00:00+00:00")])       # whole seconds
    between = st.between_stages(times)
    assert between.gaps_s == pytest.approx((8.5, 3.5, 0.0))
    assert between.pauses == 1 and between.commands_s == pytest.approx(12.0)
    assert between.sentence() == ("Between stages DVC itself took 0.2 min (3 gaps, median 3.5 s; 1 pause(s) over "
                                  "10 min left out); with the commands' 0.2 min, the run took 0.4 min.")
    assert st.between_stages(times[:1]).sentence() == "One stage: no time between stages."


def test_entry_point_records_only_under_dvc(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    with pytest.raises(SystemExit):
        main(["repro", "--help"])
    assert not (tmp_path / st.LOG).exists()
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps(_line("inventory", 2.0)) + "\n")
    assert main(["repro", "stage-times", "--log", str(other)]) == 0   # a real command, outside a stage
    assert not (tmp_path / st.LOG).exists()
    monkeypatch.setenv("DVC_STAGE", "R-D6")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    assert main(["repro", "stage-times"]) == 2                    # a failing command records nothing
    assert not (tmp_path / st.LOG).exists()
    assert main(["repro", "stage-times", "--log", str(other)]) == 0
    (line,) = [json.loads(x) for x in (tmp_path / st.LOG).read_text().splitlines()]
    assert line["stage"] == "R-D6" and line["command"] == "repro stage-times" and line["wall_s"] >= 0


def test_readme_table_is_rewritten_between_markers_only(tmp_path, monkeypatch, capsys):
    log = tmp_path / "times.jsonl"
    log.write_text("\n".join(json.dumps(x) for x in [_line("inventory", 2.0), _line("R-C1", 1.0)]) + "\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{st.README_BEGIN}\nold table\n{st.README_END}\noutro\n")
    assert main(["repro", "stage-times", "--log", str(log), "--doc", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith(f"{st.README_END}\noutro\n") and "old table" not in text
    assert "| inventory | 1 | 2.0 | 67% | 1.0 |" in text and "| readers (R-C*, R-D*) | 1 | 1.0 | 33% | 1.0 |" in text
    assert "Between stages DVC itself took 0.0 min (1 gaps, median 0.0 s)" in text
    readme.write_text("no markers\n")
    assert main(["repro", "stage-times", "--log", str(log), "--doc", str(readme)]) == 2
    assert "no markers for this table" in capsys.readouterr().err


def test_json_record_has_the_families_and_dvc_time_apart(tmp_path, monkeypatch, capsys):
    log = tmp_path / "times.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in [
        _line("DT-000@qwen-bf16-0", 30.0, started="2026-12-01T00:00:00+00:00"),
        _line("DT-000@smol-bf16-0", 10.0, started="2026-12-01T00:00:31+00:00"),    # gap 1
        _line("R-D6", 15.0, cpu=0.5, started="2026-12-01T00:00:44+00:00")]))     # gap 3
    out = tmp_path / "record.json"
    assert main(["repro", "stage-times", "--log", str(log), "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    # the family's elapsed time is the time one of its items ran: DVC's gap between them is not the family's
    assert record["families"] == {"DT-000": {"runs": 2, "wall_s": 40.0, "cpu_s": 2.0, "elapsed_s": 40.0},
                                  "readers (R-C*, R-D*)": {"runs": 1, "wall_s": 15.0, "cpu_s": 0.5,
                                                           "elapsed_s": 15.0}}
    assert (record["stages"], record["commands_s"], record["between_stages_s"]) == (3, 55.0, 4.0)
    assert record["elapsed_s"] == 59.0
    assert (record["gaps"], record["median_gap_s"], record["pauses_left_out"]) == (2, 2.0, 0)
    assert record["machine"]


def test_covered_time_counts_overlaps_once_and_the_time_between_not_at_all():
    # the readers: one at 0-1 s, one at 50-52 s (other families ran between), one inside the second
    assert st.covered_s([(50.0, 52.0), (0.0, 1.0), (50.5, 51.0)]) == 3.0
    assert st.covered_s([(0.0, 10.0), (1.0, 13.0), (10.0, 15.0)]) == 15.0   # side by side, then touching
    assert st.covered_s([]) == 0.0


def test_family_items_side_by_side_count_once_in_the_elapsed_time(tmp_path, monkeypatch, capsys):
    """Two items of a family run side by side: their walls sum to more than the family's span, which is what the
    record's elapsed time counts; the family command itself records nothing (its items record themselves)."""
    log = tmp_path / "times.jsonl"
    log.write_text("".join(json.dumps(x) + "\n" for x in [
        _line("DT-variant@a", 10.0, started="2026-12-01T00:00:00+00:00"),
        _line("DT-variant@b", 12.0, started="2026-12-01T00:00:01+00:00"),
        _line("DT-variant@c", 5.0, started="2026-12-01T00:00:10+00:00")]))
    out = tmp_path / "record.json"
    assert main(["repro", "stage-times", "--log", str(log), "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["families"]["DT-variant"] == {"runs": 3, "wall_s": 27.0, "cpu_s": 3.0, "elapsed_s": 15.0}
    assert record["elapsed_s"] == 15.0 and record["between_stages_s"] == 0.0
    import subprocess
    import sys

    (tmp_path / "params.yaml").write_text("profile: {compute: {family_jobs: 1}}\n")
    (tmp_path / "families.yaml").write_text(
        "stages:\n  F:\n    foreach: [a]\n    do:\n      cmd: echo ${item} > ${item}.txt\n      outs: [\"${item}.txt\"]\n")
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DVC_STAGE", "F")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    assert main(["repro", "family", "families.yaml", "F"]) == 0 and (tmp_path / "a.txt").exists()
    assert not (tmp_path / st.LOG).exists()
    assert main(["repro", "stage-times", "--log", str(log)]) == 0          # another command of the stage: recorded
    assert [json.loads(x)["command"] for x in (tmp_path / st.LOG).read_text().splitlines()] == ["repro stage-times"]
