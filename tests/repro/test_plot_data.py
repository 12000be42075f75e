"""The data series `dvc plots` draws (stage PLOTS): R-C3's knock-in and necessity by k, training losses per
run; and dvc.yaml's plot definitions read by DVC itself."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mistill.errors import UserError
from mistill.repro.plot_data import curves_by_k, training_curve, write_plot_data
from tests.repro.repro_helpers import REPO, commit_all, write_fixture

R_C3 = {"knockin_top3_p1": 0.31, "knockin_top8_p1": 0.62, "knockin_top3_p2c": 0.12, "knockin_top8_p2c": 0.40,
        "knockin_top8_p2": 0.55, "necessity_top8_p1": 0.21, "knockin_top8_p1_p10_p90": [0.1, 0.9],
        "own_ranking_knockin_top8_p1": 0.7, "notes_top8_p1_knockin_above_half": 9}


def values(numbers: dict) -> dict:
    return {key: {"value": value, "statistic": "median over notes", "artifact": "HD-001"}
            for key, value in numbers.items()}


def test_curves_by_k_take_one_row_per_k_and_one_column_per_phase():
    assert curves_by_k(values(R_C3), "knockin") == [{"k": 8, "P1": 0.62, "P2": 0.55, "P2C": 0.40}]  # k=3 lacks P2
    full = values({**R_C3, "knockin_top3_p2": 0.2})
    assert curves_by_k(full, "knockin") == [{"k": 3, "P1": 0.31, "P2": 0.2, "P2C": 0.12},
                                            {"k": 8, "P1": 0.62, "P2": 0.55, "P2C": 0.40}]  # spreads, other rankings: not curves
    assert curves_by_k(full, "necessity") == [{"k": 8, "P1": 0.21}]


def test_a_training_curve_keeps_the_losses_and_drops_what_the_machine_decides():
    row = {"step": 1, "loss": 2.5, "loss_attn": 0.3, "lr": 1e-4, "grad_norm": 0.9, "notes": 8,
           "step_time_s": 0.42, "peak_memory_bytes": 123}
    assert training_curve([row]) == [{"step": 1, "loss": 2.5, "loss_attn": 0.3, "lr": 1e-4, "grad_norm": 0.9,
                                      "notes": 8}]


def _runs(root: Path) -> list[Path]:
    campaigns = [root / "DT-000", root / "DT-001"]
    for campaign, run in zip(campaigns, ["student-qwen-vanilla-fp32-s0", "student-qwen-mistill-bf16-s0"]):
        (campaign / run).mkdir(parents=True)
        lines = [json.dumps({"step": s, "loss": 3.0 - s, "step_time_s": 0.1}) for s in (1, 2)]
        (campaign / run / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 3, "lo')  # cut by a kill
    return campaigns


def test_plot_data_is_written_from_the_numbers_file_and_the_runs(tmp_path):
    numbers = write_fixture(tmp_path / "results", "R-C3", values(R_C3))
    out = tmp_path / "PLOTS"
    (out / "training").mkdir(parents=True)
    (out / "training" / "a-run-since-removed.json").write_text("[]")
    written = write_plot_data(numbers, _runs(tmp_path), out)
    assert written == {"knockin_by_k": 1, "necessity_by_k": 1, "training/student-qwen-vanilla-fp32-s0": 2,
                       "training/student-qwen-mistill-bf16-s0": 2}
    assert json.loads((out / "training" / "student-qwen-mistill-bf16-s0.json").read_text()) == [
        {"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}]
    assert sorted(p.name for p in (out / "training").iterdir()) == [
        "student-qwen-mistill-bf16-s0.json", "student-qwen-vanilla-fp32-s0.json"]
    with pytest.raises(UserError, match="no <run>/metrics.jsonl"):
        write_plot_data(numbers, [tmp_path / "DT-999"], out)
    bare = write_fixture(tmp_path / "bare", "R-C3", values({"median_p1_margin": 1.0}))
    with pytest.raises(UserError, match="no knockin_top<k>_<phase> values"):
        write_plot_data(bare, _runs(tmp_path / "other"), out)


def test_dvc_draws_every_plot_dvc_yaml_declares(tmp_path):
    """dvc.yaml's plots (top-level and the PLOTS stage's) in a throwaway DVC project holding the data that
    stage writes: a line per phase for the curves by k, one plot per training run."""
    dvc = shutil.which("dvc", path=str(Path(sys.executable).parent))
    pipeline = yaml.safe_load((REPO / "dvc.yaml").read_text())
    stage = {"cmd": "true", "plots": pipeline["stages"]["PLOTS"]["plots"]}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"PLOTS": stage}, "plots": pipeline["plots"]}))
    numbers = write_fixture(tmp_path / "results", "R-C3", values({**R_C3, "knockin_top3_p2": 0.2,
                                                                 "necessity_top8_p2": 0.1, "necessity_top8_p2c": 0.3}))
    write_plot_data(numbers, _runs(tmp_path / "runs"), tmp_path / "artifacts" / "PLOTS")
    commit_all(tmp_path, init=True)
    subprocess.run([dvc, "init", "-q"], cwd=tmp_path, check=True)
    shown = json.loads(subprocess.run([dvc, "plots", "show", "--json"], cwd=tmp_path, check=True,
                                      capture_output=True, text=True).stdout)
    assert "errors" not in shown, shown["errors"]
    plots = shown["data"]
    runs = [f"artifacts/PLOTS/training/{run}.json"
            for run in ("student-qwen-mistill-bf16-s0", "student-qwen-vanilla-fp32-s0")]
    assert sorted(plots) == sorted(["knockin-by-k", "necessity-by-k", *runs])
    knockin = plots["knockin-by-k"][0]["content"]["data"]["values"]
    assert {(row["k"], row["dvc_inferred_y_value"]) for row in knockin} >= {(3, 0.31), (3, 0.2), (8, 0.40)}
    assert [row["loss"] for row in plots[runs[0]][0]["content"]["data"]["values"]] == [2.0, 1.0]
