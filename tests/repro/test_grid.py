"""The run grid as jobs: one per arm and seed from DVC's stage graph, run through submitit's local
executor (the same array a Slurm cluster gets), each stage's command with its name in DVC_STAGE."""

from __future__ import annotations

import sys

import pytest

from mistill.errors import UserError
from mistill.params import load_params
from mistill.repro.grid import Job, arm_jobs, executor, submit
from tests.repro.repro_helpers import REPO, copy_pipeline


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
    by_name = {job.name: job for job in jobs}
    first = next(iter(params["variants"]["evaluated"]))
    assert by_name[f"DT-variant@{first}"].stages[0][1] == (
        f"mistill repro family pipelines/distill/families.yaml DT-variant --item DT-variant@{first}")
    for job in jobs:
        names = [stage for stage, _ in job.stages]
        key = job.name.split("@")[1]
        assert names[0] == job.name and all(n.endswith(f"@{key}") for n in names)
        stage = job.name.split("@")[0]
        if stage in ("DT-000", "DT-001", "DT-variant"):
            family = {"DT-000": "vanilla", "DT-001": "mistill", "DT-variant": "variant"}[stage]
            # the arm's own-trace read (App. L.4) joins its job: every main arm, the variants params list
            own = stage != "DT-variant" or key in params["variants"]["own_traces"]
            evaluated = stage != "DT-variant" or key in params["variants"]["evaluated"]
            chain = stage != "DT-variant" or key in params["variants"]["own_heads"]
            # a variant's trace edits and rank probe join its job where a result reads them; the main arms' edits
            # are the stage M6-edits, which runs after the jobs
            edits = stage == "DT-variant" and key in params["variants"]["edited"]
            probe = stage == "DT-variant" and key in params["variants"]["probed"]
            assert sorted(n.split("@")[0] for n in names[1:]) == sorted(
                ([f"EV-{family}"] if evaluated else []) + ([f"M6-{family}"] if chain else [])
                + ([f"OWN-{family}"] if own else []) + (["M6-variant-edits"] if edits else [])
                + (["M6-probe"] if probe else []))
            assert job.stages[0][1].startswith("mistill distill train" if stage != "DT-variant" else
                                               "mistill repro family pipelines/distill/families.yaml")
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


def test_a_control_is_one_params_entry_that_adds_its_items_and_stales_nothing_else(tmp_path):
    """Issue of the grid: a new entry of params variants.arms resolves to its own DT-variant item (and its EV- and
    M6-variant items once variants.evaluated and variants.own_heads list it); no other stage's parameters include
    the variants' list, and no other item's key reads the new entry, so it leaves them as they were."""
    import shutil
    import subprocess

    import yaml
    from dvc.repo import Repo

    from mistill.params import load_all
    from mistill.repro.families import item_key, pipeline_families

    copy_pipeline(tmp_path)
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    data = load_all(tmp_path / "params.yaml")

    def families():
        with Repo(str(tmp_path)) as repo:
            stages = {stage.name: stage for stage in repo.index.stages}
            return stages, pipeline_families(tmp_path, stages.values())

    def keys(families, params):
        digests = lambda path: path   # the dependencies' paths stand for their content: both runs share them
        return {i.name: item_key(i, params, digests) for f in families.values() for i in f.items}

    _, before = families()
    entry = {"student": "smol", "seed": 2, "precision": "bf16", "k": 3}
    for listing in ("arms", "evaluated", "own_heads"):
        data["demo"]["variants"][listing]["fakectl"] = entry
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    stages, after = families()
    items = {i.name: i for f in after.values() for i in f.items}
    for family in ("DT-variant", "EV-variant", "M6-variant"):
        assert f"{family}@fakectl" in items and family in stages and f"{family}@fakectl" not in stages
    assert "--variant fakectl" in items["DT-variant@fakectl"].commands[0]
    assert items["DT-variant@fakectl"].outs == (("artifacts/variants/DT-001/student-smol-fakectl-bf16-s2", True),)
    assert "profile.variants.arms.fakectl" in items["DT-variant@fakectl"].params
    old, new = keys(before, {"profile": data["demo"]}), keys(after, {"profile": data["demo"]})
    assert {n: k for n, k in new.items() if n in old} == old      # every other item keeps its key

    def params_of(stage):
        return [key for dep in stage.deps if hasattr(dep, "params") for key in (dep.params or [])]

    for name, stage in stages.items():
        reads_whole_list = [key for key in params_of(stage) if key in ("profile.variants", "profile.variants.arms")]
        assert not reads_whole_list or name in after, (name, reads_whole_list)   # the family stages alone


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_mistill_runs_depend_on_the_selection_stage_they_read(tmp_path):
    """Issue of the grid: the λ the selection picks reaches the Mistill runs by DVC dependency: every DT-001 stage
    depends on the pick DT-select@<distill.lambda_from> writes, and every DT-variant stage on the picks of every
    grid (an entry may name its own in lambda_from), so a new pick retrains them; Vanilla CoT-KD reads none."""
    import shutil
    import subprocess

    from dvc.repo import Repo

    from mistill.repro.families import family_items

    copy_pipeline(tmp_path)
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    params = load_params(REPO / "params.yaml")
    picks = f"{params['selection']['dir']}/picks"
    grids = params["selection"]["grids"]
    own = {name: e["lambda_from"] for name, e in params["variants"]["arms"].items() if "lambda_from" in e}
    assert set(own.values()) - {params["distill"]["lambda_from"]}   # some variant reads a grid of its own
    with Repo(str(tmp_path)) as repo:
        stages = {stage.name: stage for stage in repo.index.stages}
        writers = {name: str(o) for name, stage in stages.items() for o in stage.outs if str(o).startswith(picks)}
        assert writers == {f"DT-select@{g}": f"{picks}/{g}.json" for g in grids}
        graph = repo.index.graph
        main = [n for n in stages if n.startswith("DT-001@")]
        assert main and all(graph.has_edge(stages[n], stages[f"DT-select@{params['distill']['lambda_from']}"])
                            for n in main)
        variants = [i.name for i in family_items(tmp_path, "pipelines/distill/families.yaml", "DT-variant")]
        assert {n.split("@")[1] for n in variants} >= set(own)
        assert all(graph.has_edge(stages["DT-variant"], stages[w]) for w in writers)   # the family stage
        assert not [n for n in stages if n.startswith("DT-000@") and any(graph.has_edge(stages[n], stages[w])
                                                                         for w in writers)]   # Vanilla has no λ
