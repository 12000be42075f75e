"""DVC's own cost per stage, one dvc.lock against the pipeline's files (mistill.repro.pipeline), side by side.

After every stage it runs, `dvc repro` updates that stage's dvc.lock: it parses the whole file with its
round-trip YAML loader and writes it back (`Stage.dump(update_pipeline=False)`, what dvc/repo/reproduce.py
calls). With one lock for all stages, that costs the same for every stage and grows with the lock. Two
commits are cloned side by side (by default the last one with a single dvc.lock, and HEAD); in each, the
benchmark times that very call for one stage of every lock file (median of `--repeats`) and weighs it by the
number of stages the lock holds: the lock updates of a full `dvc repro`. It also times the whole of
`dvc repro --single-item --force inventory`, a stage of 1-2 seconds, alternating the two clones.

    python benchmarks/bench_dvc_overhead.py [--old REV] [--new REV] [--repeats 3]

Writes benchmarks/results/dvc_overhead_<old>_<new>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PROBE_STAGE = "inventory"      # a root stage whose inputs are committed: it runs in a bare clone


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def last_single_lock_commit() -> str:
    """The parent of the commit that added the family pipeline files."""
    added = _git("log", "--diff-filter=A", "--format=%H", "--", "pipelines/distill/dvc.yaml").splitlines()
    if not added:
        raise SystemExit("no commit adds pipelines/distill/dvc.yaml: give --old")
    return _git("rev-parse", "--short", f"{added[-1]}^")


def clone(rev: str, into: Path) -> str:
    sha = _git("rev-parse", "--short", rev)
    subprocess.run(["git", "clone", "-q", "--local", "--no-checkout", str(REPO), str(into)], check=True)
    subprocess.run(["git", "-C", str(into), "checkout", "-q", sha], check=True)
    return sha


def stages_by_lock(repo, checkout: Path) -> dict[str, list]:
    """The pipeline stages of an open DVC repo, by the lock file (relative to `checkout`) that records them."""
    from dvc.stage import PipelineStage

    by_lock: dict[str, list] = {}
    for stage in repo.index.stages:
        rel = Path(stage.path).relative_to(checkout).as_posix()
        if isinstance(stage, PipelineStage) and not rel.startswith("calibration/"):
            by_lock.setdefault(Path(rel).with_name("dvc.lock").as_posix(), []).append(stage)
    return by_lock


def lock_probes(repo, checkout: Path):
    """(lock, its stages, a stage it records) for every lock file: updating the probe rewrites its own entry
    unchanged."""
    for lock, stages in sorted(stages_by_lock(repo, checkout).items()):
        recorded = set(yaml.safe_load((checkout / lock).read_text())["stages"])
        yield lock, stages, next(s for s in stages if s.name in recorded)


def lock_updates(checkout: Path, repeats: int) -> dict:
    """Per lock file: its size, the stages it holds and the median seconds of one stage's lock update."""
    from dvc.repo import Repo

    with Repo(str(checkout)) as repo:
        locks = {}
        for lock, stages, probe in lock_probes(repo, checkout):
            seconds = []
            for _ in range(repeats):
                start = time.perf_counter()
                probe.dump(update_pipeline=False)
                seconds.append(time.perf_counter() - start)
            locks[lock] = {"bytes": (checkout / lock).stat().st_size, "stages": len(stages),
                           "update_s": round(statistics.median(seconds), 3), "probe": probe.name}
    total = sum(v["stages"] * v["update_s"] for v in locks.values())
    return {"locks": locks, "stages": sum(v["stages"] for v in locks.values()), "full_run_lock_updates_s": round(total, 1)}


def single_stage_repro(checkout: Path) -> float:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    start = time.perf_counter()
    subprocess.run(["dvc", "repro", "--single-item", "--force", PROBE_STAGE], cwd=checkout, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def write_result(out: Path, name: str, result: dict) -> Path:
    """The benchmark's JSON summary under `out` (benchmarks/results by default)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", help="default: the last commit with a single dvc.lock")
    parser.add_argument("--new", default="HEAD")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    old_rev = args.old or last_single_lock_commit()
    with tempfile.TemporaryDirectory(prefix="dvc-overhead-") as tmp:
        sides = {"old": clone(old_rev, Path(tmp) / "old"), "new": clone(args.new, Path(tmp) / "new")}
        result = {"benchmark": "dvc_overhead", "old_commit": sides["old"], "new_commit": sides["new"],
                  "repeats": args.repeats}
        for side in sides:
            result[side] = lock_updates(Path(tmp) / side, args.repeats)
        walls: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(args.repeats):           # alternating, so both see the same machine load
            for side in sides:
                walls[side].append(single_stage_repro(Path(tmp) / side))
        for side in sides:
            result[side]["single_stage_repro_s"] = round(statistics.median(walls[side]), 2)
    old, new = result["old"], result["new"]
    result["ratio_full_run_lock_updates"] = round(old["full_run_lock_updates_s"] / new["full_run_lock_updates_s"], 2)
    result["ratio_single_stage_repro"] = round(old["single_stage_repro_s"] / new["single_stage_repro_s"], 2)
    for side in sides:
        print(f"{side} {result[f'{side}_commit']}:")
        for lock, v in result[side]["locks"].items():
            print(f"  {lock:32s} {v['bytes'] / 1e6:5.2f} MB  {v['stages']:4d} stages  {v['update_s']:6.2f} s per update")
        print(f"  lock updates of a full run: {result[side]['full_run_lock_updates_s']:.0f} s; "
              f"`dvc repro --single-item --force {PROBE_STAGE}`: {result[side]['single_stage_repro_s']:.1f} s")
    print(f"ratios old/new: lock updates {result['ratio_full_run_lock_updates']}x, "
          f"single-stage repro {result['ratio_single_stage_repro']}x")
    write_result(args.out, f"dvc_overhead_{sides['old']}_{sides['new']}.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
