"""`dvc` against `python -m mistill.repro.dvc_run`, side by side in one clone: DVC's own time per stage.

After every stage, `dvc repro` records it in its dvc.lock (DVC parses and rewrites the whole lock; dvc_run
rewrites the stage's own lines) and, for every stage it checks, reads the whole params.yaml (dvc_run parses
each version once). In a clone of `--rev`:

* for one stage of every lock file, that lock update (`Stage.dump`, what dvc/repo/reproduce.py calls) both ways,
  alternating, the medians weighed by the stages each lock holds: the lock updates of a full `dvc repro`;
* `dvc repro --force corpora` (the three world stages, 4 s of commands) under `mistill repro warm`, as
  `nox -s repro` runs it, both ways, alternating: the gaps between the stages' commands (what DVC itself
  takes between two stages) from the stage-times log, and the whole command's wall time.

    python benchmarks/bench_dvc_run.py [--rev HEAD] [--repeats 3]

Writes benchmarks/results/dvc_run_<rev>.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from bench_dvc_overhead import REPO, clone, lock_probes, write_result  # noqa: E402  (a sibling script)

from mistill.repro import lock_update  # noqa: E402

WAYS = {"dvc": lock_update.DVC_DUMP_STAGES, "per_entry": lock_update.dump_stages}


def lock_updates(checkout: Path, repeats: int) -> dict:
    from dvc.dvcfile import Lockfile
    from dvc.repo import Repo

    with Repo(str(checkout)) as repo:
        locks = {}
        for lock, stages, probe in lock_probes(repo, checkout):
            seconds: dict[str, list[float]] = {way: [] for way in WAYS}
            for _ in range(repeats):
                for way, dump_stages in WAYS.items():
                    Lockfile.dump_stages = dump_stages
                    start = time.perf_counter()
                    probe.dump(update_pipeline=False)
                    seconds[way].append(time.perf_counter() - start)
            Lockfile.dump_stages = lock_update.DVC_DUMP_STAGES
            locks[lock] = {"bytes": (checkout / lock).stat().st_size, "stages": len(stages), "probe": probe.name,
                           **{f"update_s_{way}": round(statistics.median(s), 4) for way, s in seconds.items()}}
    return {"locks": locks, **{f"full_run_lock_updates_s_{way}": round(sum(v["stages"] * v[f"update_s_{way}"]
                                                                          for v in locks.values()), 1)
                               for way in WAYS}}


def world_chain(checkout: Path, command: list[str]) -> tuple[float, list[float]]:
    """(wall seconds, gaps between the stages' commands) of `dvc repro --force corpora` under the warm interpreter."""
    from mistill.repro.stage_times import between_stages, latest_runs, log_path, read_log

    env = {**os.environ, "DVC_NO_ANALYTICS": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    log = log_path(checkout)
    log.unlink(missing_ok=True)
    start = time.perf_counter()
    subprocess.run(["mistill", "repro", "warm", *command, "repro", "--force", "corpora"], cwd=checkout, env=env,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start, list(between_stages(latest_runs(read_log(log))).gaps_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    args = parser.parse_args(argv)
    commands = {"dvc": ["dvc"], "dvc_run": [sys.executable, "-m", "mistill.repro.dvc_run"]}
    with tempfile.TemporaryDirectory(prefix="dvc-run-") as tmp:
        checkout = Path(tmp) / "clone"
        sha = clone(args.rev, checkout)
        result = {"benchmark": "dvc_run", "commit": sha, "repeats": args.repeats,
                  "machine": platform.processor() or platform.machine(), **lock_updates(checkout, args.repeats)}
        walls: dict[str, list[float]] = {way: [] for way in commands}
        gaps: dict[str, list[float]] = {way: [] for way in commands}
        for _ in range(args.repeats):
            for way, command in commands.items():
                wall, stage_gaps = world_chain(checkout, command)
                walls[way].append(wall)
                gaps[way] += stage_gaps
    for way in commands:
        result[f"world_chain_wall_s_{way}"] = round(statistics.median(walls[way]), 2)
        result[f"gaps_s_{way}"] = [round(g, 2) for g in gaps[way]]
        result[f"median_gap_s_{way}"] = round(statistics.median(gaps[way]), 2)
    result["ratio_full_run_lock_updates"] = round(result["full_run_lock_updates_s_dvc"]
                                                  / result["full_run_lock_updates_s_per_entry"], 1)
    result["ratio_median_gap"] = round(result["median_gap_s_dvc"] / result["median_gap_s_dvc_run"], 1)
    for lock, v in result["locks"].items():
        print(f"{lock:32s} {v['bytes'] / 1e6:5.2f} MB {v['stages']:4d} stages: "
              f"{v['update_s_dvc']:6.3f} s -> {v['update_s_per_entry']:6.3f} s per update")
    print(f"lock updates of a full run: {result['full_run_lock_updates_s_dvc']:.0f} s -> "
          f"{result['full_run_lock_updates_s_per_entry']:.0f} s")
    print(f"`dvc repro --force corpora` (3 stages, warm): {result['world_chain_wall_s_dvc']:.1f} s -> "
          f"{result['world_chain_wall_s_dvc_run']:.1f} s; median gap between stages "
          f"{result['median_gap_s_dvc']:.2f} s -> {result['median_gap_s_dvc_run']:.2f} s")
    write_result(args.out, f"dvc_run_{sha}.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
