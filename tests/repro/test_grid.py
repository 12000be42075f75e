"""The run grid as jobs: one per arm and seed from DVC's stage graph, run through submitit's local
executor (the same array a Slurm cluster gets), each stage's command with its name in DVC_STAGE."""

from __future__ import annotations

import sys

import pytest

from mistill.errors import UserError
from mistill.params import load_params
from mistill.repro.grid import Job, arm_jobs, executor, submit
from tests.repro.repro_helpers import REPO


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_job_per_training_run_with_its_evaluation_and_own_heads_chain():
    params = load_params(REPO / "params.yaml")
    jobs = arm_jobs(REPO, params["grid"]["train_stages"])
    seeds, students = params["distill"]["seeds"], params["distill"]["students"]
    runs = len(seeds) * len(students) * (len(params["distill"]["vanilla_precisions"])
                                         + len(params["distill"]["mistill_precisions"]))
    baseline_runs = {arm: len(section["runs"]) for arm, section in params["baselines"].items() if isinstance(section, dict)}
    variants = len(params["variants"]["arms"])
    assert len(jobs) == runs + variants + sum(baseline_runs.values())
    for job in jobs:
        names = [stage for stage, _ in job.stages]
        key = job.name.split("@")[1]
        assert names[0] == job.name and all(n.endswith(f"@{key}") for n in names)
        stage = job.name.split("@")[0]
        if stage in ("DT-000", "DT-001", "DT-variant"):
            family = {"DT-000": "vanilla", "DT-001": "mistill", "DT-variant": "variant"}[stage]
            assert sorted(n.split("@")[0] for n in names[1:]) == [f"EV-{family}", f"M6-{family}"]
            assert job.stages[0][1].startswith("mistill distill train")
        else:   # a baseline arm: its evaluation, and Feature-KD's own-heads chain
            arm = stage.removeprefix("DT-000-")
            assert sorted(n.split("@")[0] for n in names[1:]) == [f"EV-{arm}"] + (["M6-featurekd"] if arm == "featurekd" else [])
            command = "onpolicy" if arm in ("opd", "gold") else "train"
            assert job.stages[0][1].startswith(f"mistill baselines {command} --arm {arm}")
    with pytest.raises(UserError, match="no stage DT-999"):
        arm_jobs(REPO, ["DT-999"])


def _write(name: str) -> str:
    return f"{sys.executable} -c \"import os; open(os.environ['DVC_STAGE'] + '.{name}', 'w').write('x')\""


def test_jobs_run_through_the_local_executor(tmp_path):
    jobs = [Job("DT@a", (("DT@a", _write("done")), ("EV@a", _write("done")))),
            Job("DT@b", (("DT@b", _write("done")), ("EV@b", "exit 3"), ("M6@b", _write("done"))))]
    handles = submit(jobs, tmp_path, executor("local", tmp_path / "logs"))
    assert handles[0].result() == ["DT@a", "EV@a"]
    with pytest.raises(Exception, match="EV@b: `exit 3` exited with 3"):
        handles[1].result()
    assert sorted(p.name for p in tmp_path.glob("*.done")) == ["DT@a.done", "DT@b.done", "EV@a.done"]
    with pytest.raises(UserError, match="executor 'pbs'"):
        executor("pbs", tmp_path)
    with pytest.raises(UserError, match="no job to submit"):
        submit([], tmp_path, executor("local", tmp_path / "logs"))
