"""Where a training run lives: the one naming rule that `dvc.yaml`'s outputs and the code share.

    <runs_dir>/<campaign>/student-<label>-<arm>-<precision>-s<seed>

`label` is the student's params key without its `student_` prefix (`student_qwen` -> `qwen`), never
the model's id or directory, so a run is named the same whichever checkpoint the profile loads.
The campaign is the paper's artifact name: DT-001 for Mistill, DT-000 for the baselines.
"""

from __future__ import annotations

from pathlib import Path

from mistill.errors import UserError


def student_label(student_key: str) -> str:
    if not student_key.startswith("student_") or student_key == "student_":
        raise UserError(f"student {student_key!r}: students are params keys student_<label> (student_qwen, ...)")
    return student_key.removeprefix("student_")


def campaign(arm: str) -> str:
    return "DT-001" if arm == "mistill" else "DT-000"


def run_name(student_key: str, arm: str, precision: str, seed: int) -> str:
    return f"student-{student_label(student_key)}-{arm}-{precision}-s{int(seed)}"


def run_dir(runs_dir: str | Path, student_key: str, arm: str, precision: str, seed: int) -> Path:
    return Path(runs_dir) / campaign(arm) / run_name(student_key, arm, precision, seed)
