"""Time the whole demo world build: inventory -> notes -> corpora -> shortlists -> teacher -> students -> traces.

Runs the real CLI stages (`mistill world ...`, `mistill models ...`) in a scratch directory, with a
copy of params.yaml whose artifact and model paths point into it, so the repository's own
artifacts and committed weights are left alone.  Prints one line per stage and a JSON summary.

Teacher training on CPU takes far longer than the rest of the build; by default the benchmark
times `--teacher-steps` optimiser steps and extrapolates to the full schedule (the number of
steps is exact: examples / batch size x epochs), and the trace stages use the committed teacher.
`--full-teacher` trains the whole schedule and traces with the freshly trained teacher.

    python benchmarks/bench_world.py                       # 2 CPU threads, timed teacher steps
    python benchmarks/bench_world.py --threads 1 --trace-limit 4 --out bench_world.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def run_stage(name: str, argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mistill.cli", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    last = [line for line in proc.stdout.splitlines() if line.strip()]
    print(f"{name:<24} {seconds:8.1f}s  {last[-1] if last else ''}", flush=True)
    return seconds, proc.stdout


def scratch_params(workdir: Path, threads: int, profile: str) -> dict:
    """params.yaml with artifacts and the students under `workdir`; the teacher stays the committed one
    unless the benchmark trains it."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    section = params[profile]
    section["paths"] = {**section["paths"], "artifacts": str(workdir / "artifacts"),
                        "results": str(workdir / "results")}
    models = section["models"]
    models["teacher"] = str(ROOT / models["teacher"])
    models["student_qwen"] = str(workdir / "models" / "student-qwen")
    models["student_smol"] = str(workdir / "models" / "student-smol")
    models["threads"] = threads
    params["profile"] = profile
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return params


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (the target machine has 2 cores)")
    parser.add_argument("--teacher-steps", type=int, default=3, help="teacher steps timed, then extrapolated")
    parser.add_argument("--full-teacher", action="store_true", help="train the full schedule")
    parser.add_argument("--trace-limit", type=int, help="trace only the first N notes of each set")
    parser.add_argument("--profile", default="demo")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--out", help="write the JSON summary here")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench_world."))
    params = scratch_params(workdir, args.threads, args.profile)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(args.threads),
           "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
    stages: dict[str, float] = {}
    try:
        for name in ("inventory", "notes", "corpora", "shortlists"):
            stages[f"world {name}"], _ = run_stage(f"world {name}", ["world", name], workdir, env)

        teacher_out = workdir / "models" / "teacher"
        train_argv = ["models", "train-teacher", "--device", "cpu", "--out", str(teacher_out)]
        if not args.full_teacher:
            train_argv += ["--max-steps", str(args.teacher_steps)]
        seconds, _stdout = run_stage("models train-teacher", train_argv, workdir, env)
        stages["models train-teacher"] = seconds
        log = json.loads((teacher_out / "training_log.json").read_text())
        steps = log["steps"]
        cfg = params[args.profile]["models"]["teacher_training"]
        total_steps = int(cfg["epochs"]) * sum(
            math.ceil(n / int(cfg["batch_size"])) for n in log["provenance"]["kinds"].values())
        per_step = (steps[-1]["seconds"] - steps[0]["seconds"]) / max(1, len(steps) - 1) if len(steps) > 1 \
            else steps[-1]["seconds"]
        setup = seconds - steps[-1]["seconds"]
        stages["teacher setup (examples, model)"] = round(setup, 1)
        stages["teacher seconds per step"] = round(per_step, 2)
        stages["teacher full schedule (extrapolated)"] = round(setup + per_step * total_steps, 1)
        stages["teacher steps in full schedule"] = total_steps
        if args.full_teacher:
            text = (workdir / "params.yaml").read_text()
            (workdir / "params.yaml").write_text(text.replace(str(ROOT / "models/demo/teacher"), str(teacher_out)))

        stages["models init-students"], _ = run_stage("models init-students", ["models", "init-students"], workdir, env)
        for trace_set in ("TR-006", "TR-007", "TR-008"):
            argv = ["models", "traces", "--set", trace_set, "--device", "cpu"]
            if args.trace_limit:
                argv += ["--limit", str(args.trace_limit)]
            stages[f"models traces {trace_set}"], _ = run_stage(f"models traces {trace_set}", argv, workdir, env)

        measured = sum(v for k, v in stages.items() if not k.startswith("teacher "))
        summary = {
            "machine": {"platform": platform.platform(), "processor": platform.processor(),
                        "cpu_count": os.cpu_count(), "threads": args.threads},
            "stages_seconds": stages,
            "measured_total_seconds": round(measured, 1),
            "total_with_full_teacher_seconds": round(
                measured if args.full_teacher else
                measured - stages["models train-teacher"] + stages["teacher full schedule (extrapolated)"], 1),
            "trace_limit": args.trace_limit,
        }
        print(json.dumps(summary, indent=2))
        if args.out:
            Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    finally:
        if args.keep:
            print(f"scratch directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
