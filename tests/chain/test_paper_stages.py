"""Under `profile: *paper`, the stage graph DVC would run names the paper's models and seeds.

Every model, run directory and seed of a stage comes from the active profile's params: switching the
profile's alias is the only edit, and `dvc repro --dry --force` lists what a GPU cluster would run.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mistill.repro.pipeline import pipeline_files, stage_name
from tests.repro.repro_helpers import copy_pipeline

ROOT = Path(__file__).resolve().parents[2]
DVC = Path(sys.executable).with_name("dvc")
TEACHER, QWEN, SMOL = "Qwen/Qwen3-14B", "Qwen/Qwen3-4B", "HuggingFaceTB/SmolLM3-3B"


def dry_run(tmp_path: Path, profile: str) -> dict[str, list[str]]:
    """stage name -> its commands, as `dvc repro --dry --force` prints them for the R-D results."""
    params = (ROOT / "params.yaml").read_text()
    params, n = re.subn(r"(?m)^profile: \*\w+$", f"profile: *{profile}", params)
    assert n == 1, "params.yaml must end in one `profile: *<name>` line"
    (tmp_path / "params.yaml").write_text(params)
    copy_pipeline(tmp_path, ROOT)
    subprocess.run([str(DVC), "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    out = subprocess.run([str(DVC), "repro", "--dry", "--force", "R-D1", "R-D2", "R-D5", "R-D6"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    stages: dict[str, list[str]] = {}
    current = None
    for line in out.stdout.splitlines():
        if m := re.match(r"Running stage '(.+)':", line):
            current = stage_name(m.group(1))   # a family file's stage by its name
            stages[current] = []
        elif line.startswith("> ") and current:
            stages[current].append(line[2:])
    return stages


@pytest.fixture(scope="module")
def paper_stages(tmp_path_factory) -> dict[str, list[str]]:
    if not DVC.exists():
        pytest.skip("dvc is not installed beside this interpreter")
    return dry_run(tmp_path_factory.mktemp("paper"), "paper")


def test_no_stage_names_a_demo_path():
    for name in pipeline_files(ROOT):
        assert "models/demo" not in (ROOT / name).read_text(), name


def test_teacher_stages_name_the_teacher(paper_stages):
    for stage in ("TR-007", "TR-008", "DT-targets"):
        assert any(TEACHER in cmd for cmd in paper_stages[stage]), stage


def test_untrained_students_are_the_paper_models(paper_stages):
    for stage_kind in ("HD-S-untrained", "EV-untrained", "M6-untrained"):
        assert any(QWEN in c for c in paper_stages[f"{stage_kind}@qwen"])
        assert any(SMOL in c for c in paper_stages[f"{stage_kind}@smol"])
    assert not any("models/" in c for cmds in paper_stages.values() for c in cmds)


def test_every_trained_arm_runs_seeds_0_1_2(paper_stages):
    arms = {"DT-000": ("fp32", "bf16"), "DT-001": ("bf16",), "EV-vanilla": ("fp32", "bf16"),
            "EV-mistill": ("bf16",), "M6-vanilla": ("fp32", "bf16"), "M6-mistill": ("bf16",)}
    for kind, precisions in arms.items():
        for student in ("qwen", "smol"):
            for precision in precisions:
                for seed in (0, 1, 2):
                    name = f"{kind}@{student}-{precision}-{seed}"
                    assert name in paper_stages, name
                    assert any(f"-s{seed}" in c or f"--seed {seed}" in c for c in paper_stages[name]), name


def test_run_directories_follow_one_rule(paper_stages):
    from mistill.distill.runs import run_dir

    for seed in (0, 1, 2):
        trained = run_dir("artifacts", "student_smol", "mistill", "bf16", seed) / "model"
        assert any(str(trained) in c for c in paper_stages[f"EV-mistill@smol-bf16-{seed}"])
        assert any(str(trained) in c for c in paper_stages[f"M6-mistill@smol-bf16-{seed}"])
