"""The run grid on a cluster: one job per arm and seed, dispatched by submitit (Slurm job arrays).

DVC runs one stage at a time in a workspace (`dvc repro` holds the repository's lock), so the grid's
independent chains (each training run, its evaluation and its own-heads chain) cannot be several
`dvc repro` processes in one checkout. A job here runs the commands DVC would run for one arm and
seed, in DVC's order, with the stage's name in `DVC_STAGE` as `dvc repro` sets it; when the array
has finished, `dvc commit` records every output in the pipeline files' dvc.lock and `dvc repro` finds them up to date.
Which stages belong to an arm is read from DVC's own stage graph: a training run (a matrix item
of `grid.train_stages`) and every matrix item downstream of it with the same item key.

submitit does the scheduling: `slurm` submits an array (resources from params `grid.slurm`),
`local` runs the jobs as processes of this host (what the tests use), `debug` in this process.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mistill.errors import UserError

EXECUTORS = ("slurm", "local", "debug")


@dataclass(frozen=True)
class Job:
    """One arm and seed: its stages' commands, in the order DVC would run them."""

    name: str                                  # the training stage's item, e.g. DT-000@qwen-fp32-0
    stages: tuple[tuple[str, str], ...]        # (stage name, command)

    def __call__(self, repo: str) -> list[str]:
        """Run every command in `repo`; stop at the first that fails. Returns the stage names run."""
        done = []
        for stage, command in self.stages:
            env = {**os.environ, "DVC_STAGE": stage}
            result = subprocess.run(command, shell=True, cwd=repo, env=env)
            if result.returncode != 0:
                raise RuntimeError(f"{stage}: `{command}` exited with {result.returncode}")
            done.append(stage)
        return done


def arm_jobs(repo: str | Path, train_stages: Sequence[str]) -> list[Job]:
    """A job per matrix item of `train_stages`, with the items downstream of it that share its key. A family
    stage (mistill.repro.families) counts as the matrix of its items, each run by `mistill repro family --item`."""
    import networkx as nx
    from dvc.repo import Repo

    from mistill.repro.families import pipeline_families

    with Repo(str(repo)) as dvc:
        graph = dvc.index.graph                 # edges point from a stage to the stages it depends on
        by_name = {s.name: s for s in graph}
        unknown = [t for t in train_stages if not any(n.split("@")[0] == t for n in by_name)]
        if unknown:
            raise UserError(f"grid.train_stages: no stage {', '.join(unknown)} in the pipeline files")
        families = pipeline_families(Path(repo), graph)
        order = {s.name: i for i, s in enumerate(reversed(list(nx.topological_sort(graph))))}

        def items(stage) -> dict[str, tuple[str, str]]:
            """key -> (item name, command) of a matrix item or of each item of a family stage."""
            if stage.name in families:
                family = families[stage.name]
                return {i.name.split("@", 1)[1]: (i.name, family.command(i)) for i in family.items}
            if "@" in stage.name:
                return {stage.name.split("@", 1)[1]: (stage.name, stage.cmd)}
            return {}

        jobs = []
        for train in sorted((s for s in graph if s.name.split("@")[0] in train_stages), key=lambda s: s.name):
            downstream = sorted(nx.ancestors(graph, train), key=lambda s: order[s.name])
            downstream_items = [items(s) for s in downstream]
            for key, first in sorted(items(train).items()):
                stages = [first, *(found[key] for found in downstream_items if key in found)]
                jobs.append(Job(first[0], tuple(stages)))
    return sorted(jobs, key=lambda job: job.name)


def executor(kind: str, folder: str | Path, slurm: Mapping[str, Any] | None = None):
    """A submitit executor: a Slurm array with params `grid.slurm` resources, or local processes."""
    import submitit

    if kind not in EXECUTORS:
        raise UserError(f"executor {kind!r}: expected one of {', '.join(EXECUTORS)}")
    ex = submitit.AutoExecutor(folder=str(folder), cluster=kind)
    settings = dict(slurm or {})
    if kind == "slurm":
        ex.update_parameters(**settings)
    else:   # resources mean nothing to local processes; a time limit still does
        ex.update_parameters(timeout_min=int(settings.get("timeout_min", 60)))
    return ex


def submit(jobs: Sequence[Job], repo: str | Path, ex) -> list:
    """The jobs as one array; returns submitit's job handles (`.result()` waits for one)."""
    if not jobs:
        raise UserError("grid: no job to submit (the profile lists no arm of grid.train_stages)")
    return ex.map_array(lambda job: job(str(repo)), list(jobs))


def cmd_grid(args) -> int:
    from mistill.params import load_params

    params = load_params()
    section = params.get("grid") or {}
    jobs = arm_jobs(".", section.get("train_stages", ("DT-000", "DT-001")))
    if args.list:
        for job in jobs:
            print(f"{job.name}: {' -> '.join(stage for stage, _ in job.stages)}")
        return 0
    handles = submit(jobs, Path.cwd(), executor(args.executor, args.folder, section.get("slurm")))
    print(f"submitted {len(handles)} jobs ({args.executor}; logs under {args.folder}): "
          + ", ".join(str(h.job_id) for h in handles))
    if not args.wait:
        print("when they have finished: dvc commit -f, then dvc repro (every stage of the grid up to date)")
        return 0
    failed = 0
    for job, handle in zip(jobs, handles):
        try:
            handle.result()
        except Exception as err:   # submitit re-raises the job's failure here
            failed += 1
            print(f"{job.name}: failed ({str(err).splitlines()[-1] if str(err) else type(err).__name__})")
    print(f"{len(jobs) - failed} of {len(jobs)} jobs finished; now dvc commit -f, then dvc repro")
    return 1 if failed else 0


def register(subparsers) -> None:
    p = subparsers.add_parser("grid", help="the run grid as one job per arm and seed (submitit: Slurm or local)")
    p.add_argument("--executor", choices=EXECUTORS, default="slurm", help="where the jobs run (default: slurm)")
    p.add_argument("--folder", default=".dvc/tmp/mistill/grid", help="submitit's logs and pickles")
    p.add_argument("--wait", action="store_true", help="wait for every job and report failures")
    p.add_argument("--list", action="store_true", help="print the jobs and their stages; submit nothing")
    p.set_defaults(func=cmd_grid)
