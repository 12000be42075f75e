"""The demo chain of two commits, side by side on one machine: per-stage wall times and ratios.

Each commit is cloned into a fresh directory with its own environment (`./setup.sh`), then both
run `dvc repro` (all stages, or the targets given) as their `nox -s repro` runs it (under `mistill
repro warm` where the commit has it; `--cold` runs plain `dvc repro` for both) at the same time, so they share the machine's
load and a ratio compares like with like. A stage's time is read from DVC's own output: the time
between its "Running stage" line and the next one (or the end), which includes DVC's hashing of
its outputs. Works for any commit, including those whose commands record no times themselves.

    nox -s bench_chain -- --old 6787fe8 --new HEAD
    python benchmarks/chain_side_by_side.py --old 6787fe8 --new HEAD --targets R-C3 --sequential
    python benchmarks/chain_side_by_side.py --old 6787fe8 --sequential --new-targets $(cat stages.txt)

`--new-targets` gives the new commit its own targets, for a chain whose stages have since moved (a
family file's `pipelines/<family>/dvc.yaml:NAME`) or whose readers have since grown; the table's
last rows then sum the stages both runs ran apart from those only one of them ran.

Writes `benchmarks/results/demo_chain_<old>_<new>.json` and prints a table by stage family.
Side by side needs at least twice the cores one chain's stages use (the demo's stages run 2
threads): two chains of 2 threads on 2 cores oversubscribe them, and OpenMP's spinning threads
then waste most of the time (measured: TR-006 took 1,118 s of wall and CPU time instead of 41 s).
With fewer cores the benchmark refuses side by side; `--sequential` runs one chain after the other.
A full demo chain is tens of minutes per commit on two cores, so it has its own session
(`nox -s bench_chain`) rather than running with the quick benchmarks of `nox -s bench`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mistill.repro.pipeline import stage_name

REPO = Path(__file__).resolve().parents[1]
RUNNING = re.compile(r"Running stage '([^']+)'")


def clone(rev: str, into: Path) -> str:
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", rev], check=True, capture_output=True,
                         text=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", str(REPO), str(into)], check=True)
    subprocess.run(["git", "-C", str(into), "checkout", "-q", sha], check=True)
    subprocess.run(["./setup.sh"], cwd=into, check=True, stdout=subprocess.DEVNULL)
    return sha


def repro_command(workdir: Path, targets: list[str], cold: bool = False) -> list[str]:
    """`dvc repro` as the commit's `nox -s repro` runs it: under its warm interpreter where it has one."""
    warm = not cold and (workdir / "src" / "mistill" / "warm.py").is_file()
    return [*(["mistill", "repro", "warm"] if warm else []), "dvc", "repro", *targets]


def timed_repro(workdir: Path, targets: list[str], out: dict, cold: bool = False) -> None:
    """Run `dvc repro`, timestamping every stage start as DVC prints it."""
    start = time.perf_counter()
    marks: list[tuple[str, float]] = []
    env = dict(os.environ)
    own = workdir / ".venv" / "bin"   # the clone's environment (its dvc and the mistill its stages call)
    if own.is_dir():
        env["PATH"] = f"{own}{os.pathsep}{env.get('PATH', '')}"
    command = repro_command(workdir, targets, cold)
    out["command"] = " ".join(command[:len(command) - len(targets)])   # the targets are recorded apart
    proc = subprocess.Popen(command, cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    tail: list[str] = []
    for line in proc.stdout:
        if m := RUNNING.search(line):
            # a family file's stage (pipelines/<family>/dvc.yaml:NAME) by its name, as older commits name it
            marks.append((stage_name(m.group(1)), time.perf_counter() - start))
        tail = (tail + [line.rstrip()])[-20:]
    proc.wait()
    end = time.perf_counter() - start
    bounds = [t for _, t in marks[1:]] + [end]
    out.update({"returncode": proc.returncode, "total_s": round(end, 1),
                "stages": {name: round(stop - begin, 1) for (name, begin), stop in zip(marks, bounds)},
                "tail": tail if proc.returncode else []})


def family(stage: str) -> str:
    return stage.split("@", 1)[0]


def table(old: dict, new: dict) -> str:
    families: dict[str, list[float]] = {}
    for which, run in ((0, old), (1, new)):
        for stage, seconds in run["stages"].items():
            families.setdefault(family(stage), [0.0, 0.0])[which] += seconds
    lines = ["| stage | old (s) | new (s) | old / new |", "|---|---|---|---|"]
    for name, (a, b) in families.items():
        lines.append(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.2f} |" if b else f"| {name} | {a:.1f} | {b:.1f} | - |")
    a, b = old["total_s"], new["total_s"]
    lines.append(f"| **total** | **{a:.1f}** | **{b:.1f}** | **{a / b:.2f}** |")
    common = old["stages"].keys() & new["stages"].keys()
    if common != old["stages"].keys() | new["stages"].keys():
        a, b = (sum(run["stages"][stage] for stage in common) for run in (old, new))
        lines.append(f"| stages both ran ({len(common)}) | {a:.1f} | {b:.1f} | {a / b:.2f} |")
        for which, run in (("old", old), ("new", new)):
            only = sorted(run["stages"].keys() - common)
            if only:
                seconds = f"{sum(run['stages'][stage] for stage in only):.1f}"
                cells = f"{seconds} | " if which == "old" else f" | {seconds}"
                lines.append(f"| only the {which} ran: {', '.join(only)} | {cells} | |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="the baseline commit")
    parser.add_argument("--new", default="HEAD")
    parser.add_argument("--targets", nargs="*", default=[], help="dvc repro targets (default: every stage)")
    parser.add_argument("--new-targets", nargs="*", help="the new commit's own targets (default: --targets)")
    parser.add_argument("--sequential", action="store_true", help="one commit after the other instead of together")
    parser.add_argument("--cold", action="store_true",
                        help="plain `dvc repro` for both, even where a commit has the warm interpreter")
    parser.add_argument("--workdir", type=Path, help="where the clones go (default: a temporary directory)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if not args.sequential and cores < 4:
        parser.error(f"side by side needs at least 4 cores (two chains of 2-thread stages); this machine has "
                     f"{cores}: use --sequential")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="mistill-chain-"))
    runs: dict[str, dict] = {"old": {}, "new": {}}
    shas = {which: clone(rev, workdir / which) for which, rev in (("old", args.old), ("new", args.new))}
    targets = {"old": args.targets, "new": args.targets if args.new_targets is None else args.new_targets}
    jobs = [threading.Thread(target=timed_repro, args=(workdir / which, targets[which], runs[which], args.cold))
            for which in ("old", "new")]
    for job in jobs:
        job.start()
        if args.sequential:
            job.join()
    for job in jobs:
        job.join()
    report = {"benchmark": "chain_side_by_side", "old_commit": shas["old"], "new_commit": shas["new"],
              "targets": targets["old"], "new_targets": targets["new"], "side_by_side": not args.sequential, **runs}
    out = args.out or REPO / "benchmarks" / "results" / f"demo_chain_{shas['old'][:7]}_{shas['new'][:7]}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(runs["old"], runs["new"]))
    print(f"-> {out}")
    return 0 if runs["old"]["returncode"] == 0 and runs["new"]["returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
