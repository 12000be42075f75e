"""The side-by-side chain benchmark reads stage times from DVC's own output."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("chain_side_by_side", REPO / "benchmarks" / "chain_side_by_side.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_stage_times_come_from_dvc_output(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["dvc", "init", "-q"], cwd=tmp_path, check=True)
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n"
        "  slow:\n    cmd: sleep 1.2 && echo a > a.txt\n    outs: [a.txt]\n"
        "  fast:\n    cmd: cat a.txt > b.txt\n    deps: [a.txt]\n    outs: [b.txt]\n")
    run: dict = {}
    bench.timed_repro(tmp_path, [], run)
    assert run["returncode"] == 0 and list(run["stages"]) == ["slow", "fast"]
    assert run["stages"]["slow"] >= 1.2 and run["stages"]["fast"] < run["stages"]["slow"]
    assert run["total_s"] >= sum(run["stages"].values()) - 0.2


def test_table_sums_matrix_items_and_gives_ratios():
    old = {"total_s": 100.0, "stages": {"DT-000@qwen-bf16-0": 30.0, "DT-000@smol-bf16-0": 30.0, "R-D6": 40.0}}
    new = {"total_s": 50.0, "stages": {"DT-000@qwen-bf16-0": 10.0, "DT-000@smol-bf16-0": 10.0, "R-D6": 30.0}}
    lines = bench.table(old, new).splitlines()
    assert lines[2] == "| DT-000 | 60.0 | 20.0 | 3.00 |"
    assert lines[3] == "| R-D6 | 40.0 | 30.0 | 1.33 |"
    assert lines[-1] == "| **total** | **100.0** | **50.0** | **2.00** |"
