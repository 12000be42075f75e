"""Replicates of the distillation chain: their params, their perturbed students, their workspaces."""

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from mistill.errors import UserError
from mistill.params import load_all, load_params
from mistill.repro.pipeline import stage_addresses
from mistill.repro.replicates import (
    CalibrationConfig,
    Replicate,
    Workspace,
    check_inputs_cover_deps,
    check_inputs_not_written,
    check_stage_order,
    jitter_weights,
    replicate_params,
    stage_deps,
    stage_outs,
)
from tests.repro.repro_helpers import REPO


@pytest.fixture
def config() -> CalibrationConfig:
    return CalibrationConfig.from_params(load_params(REPO / "params.yaml"))


def test_the_demo_calibrates_with_five_replicates_of_one_perturbation_each(config):
    assert [r.name for r in config.replicates] == ["threads-1", "jitter-1", "jitter-2", "seed-1", "isa-avx2"]
    avx2 = dict(config.replicates[-1].env)     # an AVX2-only CPU's kernels, bf16 products through fp32
    assert avx2 == {"ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "MISTILL_BF16_GEMM": "emulate"}
    assert config.family_alpha == 0.05
    # every trained-student result whose values a second machine's run moved beyond their class tolerances, but
    # R-D10, which reads the λ grid: an input of the replicates, so they would measure half of its differences
    assert config.results == ("R-D1", "R-D2", "R-D5", "R-D6", "R-D7", "R-D12", "R-D13", "R-D14", "R-D18",
                              "R-D19", "R-D24", "R-D25", "R-D27", "R-D28", "R-D29", "R-D30", "R-D36")
    assert not any(stage.startswith("EV-val") for stage in config.stages)      # only R-D10 reads them


def test_replicate_params_override_the_active_profile_and_keep_the_alias(tmp_path):
    data = load_all(REPO / "params.yaml")
    changed = replicate_params(data, Replicate("r", threads=1, train_seed=3))
    assert data["profile"]["models"]["threads"] == 2          # the original is untouched
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(changed, sort_keys=False))
    active = load_params(path)
    assert active["profile"] == "demo"
    assert active["models"]["threads"] == 1 and active["distill"]["seeds"] == [3]
    original = load_params(REPO / "params.yaml")["variants"]["arms"]
    assert {name: entry["seed"] for name, entry in active["variants"]["arms"].items()} == {
        name: 3 + entry["seed"] for name, entry in original.items()}            # each keeps its offset from seed 0
    assert active["variants"]["arms"]["randheads1"]["seed"] == 4
    loaded = load_all(path)
    assert loaded["profile"] is loaded["demo"]                  # written as an anchor and its alias


def test_jitter_weights_moves_float_tensors_by_the_scale_and_is_seeded(tmp_path):
    src, a, b, c = (tmp_path / n for n in ("src", "a", "b", "c"))
    src.mkdir()
    torch.manual_seed(0)
    tensors = {"w": torch.randn(64, 64), "ids": torch.arange(10)}
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    (src / "config.json").write_text("{}")
    assert jitter_weights(src, a, 1e-3, seed=1) == 1
    jitter_weights(src, b, 1e-3, seed=1)
    jitter_weights(src, c, 1e-3, seed=2)
    wa, wb, wc = (load_file(str(d / "model.safetensors")) for d in (a, b, c))
    rel = (wa["w"] - tensors["w"]) / tensors["w"]
    assert 0.8e-3 < rel.double().std().item() < 1.2e-3           # 1 + 1e-3 N(0, 1)
    assert torch.equal(wa["w"], wb["w"]) and not torch.equal(wa["w"], wc["w"])
    assert torch.equal(wa["ids"], tensors["ids"])                  # integers are never perturbed
    assert (a / "config.json").exists()


def test_no_replicate_stage_may_write_a_hard_linked_input(config):
    outs = stage_outs(REPO, config.stages)
    check_inputs_not_written(config, outs)                         # the demo's configuration is safe
    # an item names its own outputs only; a family stage the directory that holds all of its items'
    assert outs["DT-variant@nowindow"] == ["artifacts/variants/DT-001/student-qwen-nowindow-bf16-s0"]
    assert stage_outs(REPO, ("DT-variant",))["DT-variant"] == ["artifacts/variants/DT-001"]
    distill = load_params(REPO / "params.yaml")["distill"]   # a matrix group: every item's output
    assert len(stage_outs(REPO, ("DT-000",))["DT-000"]) == (
        len(distill["students"]) * len(distill["vanilla_precisions"]) * len(distill["seeds"]))
    with pytest.raises(UserError, match="hard-linked input artifacts/TR-008"):
        check_inputs_not_written(config, {**outs, "X": ["artifacts/TR-008/events"]})


def test_every_artifact_a_replicate_stage_reads_is_an_input_or_a_replicate_output(config):
    outs, deps = stage_outs(REPO, config.stages), stage_deps(REPO, config.stages)
    check_inputs_cover_deps(config, deps, outs)                    # the demo's configuration runs through
    assert "artifacts/HD-002-locus" in deps["DT-variant@nowindow"]   # the 8-token window's prose-time sets
    without = dataclasses.replace(config, inputs=tuple(i for i in config.inputs if i != "artifacts/HD-002-locus"))
    with pytest.raises(UserError, match="reads artifacts/HD-002-locus, which no replicate stage writes"):
        check_inputs_cover_deps(without, deps, outs)


def test_a_stage_runs_after_every_replicate_stage_that_writes_what_it_reads(config):
    outs, deps = stage_outs(REPO, config.stages), stage_deps(REPO, config.stages)
    check_stage_order(config, deps, outs)                          # the demo's order runs through
    late = dataclasses.replace(config, stages=tuple(s for s in config.stages if s != "DT-000") + ("DT-000",))
    with pytest.raises(UserError, match=r"EV-vanilla reads artifacts/DT-000/student-qwen-vanilla-fp32-s0, which "
                                        r"DT-000 writes, listed after it; list DT-000 first"):
        check_stage_order(late, deps, outs)
    own = "OWN-variant@fp32pick2"
    last = dataclasses.replace(config, stages=tuple(s for s in config.stages if s != own) + (own,))
    with pytest.raises(UserError, match=rf"R-D30 reads artifacts/variants/own-trace, which {own} writes"):   # a whole directory
        check_stage_order(last, deps, outs)


def test_config_errors_name_the_field():
    params = load_params(REPO / "params.yaml")
    params["calibration"] = {**params["calibration"], "replicates": {"bad": {"thread": 1}}}
    with pytest.raises(UserError, match="unknown field.*thread"):
        CalibrationConfig.from_params(params)
    params["calibration"]["replicates"] = {"bad": {"threads": 0}}
    with pytest.raises(UserError, match="threads >= 1"):
        CalibrationConfig.from_params(params)


def test_a_workspace_links_inputs_copies_students_and_runs_dvc(tmp_path):
    """A replicate workspace on a miniature repository: inputs are hard links (same inode), the
    perturbed student is a new file, params carry the override, and DVC runs a stage there."""
    repo = tmp_path / "repo"
    (repo / "artifacts" / "data").mkdir(parents=True)
    (repo / "artifacts" / "data" / "notes.jsonl").write_text('{"id": 1}\n')
    for role in ("teacher", "student-qwen"):
        (repo / "models" / "demo" / role).mkdir(parents=True)
        save_file({"w": torch.ones(4)}, str(repo / "models" / "demo" / role / "model.safetensors"))
    (repo / "dvc.yaml").write_text("stages:\n  COUNT:\n    cmd: wc -l artifacts/data/notes.jsonl > count.txt\n"
                                   "    deps: [artifacts/data/notes.jsonl]\n    params: [profile.models.threads]\n"
                                   "    outs: [count.txt]\n")
    data = {"demo": {"name": "demo", "models": {"dir": "models/demo", "threads": 2}, "distill": {"seeds": [0]}}}
    data["profile"] = data["demo"]
    config = CalibrationConfig(scratch=Path("scratch"), out=Path("out"), inputs=("artifacts/data",),
                               stages=("COUNT",), results=(), family_alpha=0.05, replicates=())
    ws = Workspace(repo / "scratch" / "j", Replicate("j", threads=1, weight_jitter=1e-3, jitter_seed=0))
    ws.build(repo, data, config)
    linked = ws.root / "artifacts" / "data" / "notes.jsonl"
    assert linked.stat().st_ino == (repo / "artifacts" / "data" / "notes.jsonl").stat().st_ino
    teacher = ws.root / "models" / "demo" / "teacher" / "model.safetensors"
    assert teacher.stat().st_ino == (repo / "models" / "demo" / "teacher" / "model.safetensors").stat().st_ino
    student = load_file(str(ws.root / "models" / "demo" / "student-qwen" / "model.safetensors"))["w"]
    assert not torch.equal(student, torch.ones(4))
    assert load_params(ws.root / "params.yaml")["models"]["threads"] == 1
    ws.run_stages(stage_addresses(ws.root, config.stages), log=lambda line: None)
    assert (ws.root / "count.txt").read_text().split()[0] == "1"


def test_the_held_out_replicate_emulates_a_cpu_without_amx(config):
    (held,) = config.held_out
    assert dict(held.env) == {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI", "MKL_ENABLE_INSTRUCTIONS": "AVX512"}
    assert "ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI" in held.describe()


def test_replicate_names_are_distinct_across_replicates_and_held_out():
    params = load_params(REPO / "params.yaml")
    params["calibration"] = {**params["calibration"], "held_out": {"seed-1": {"env": {"X": "1"}}}}
    with pytest.raises(UserError, match="distinct names"):
        CalibrationConfig.from_params(params)
    params["calibration"]["held_out"] = {"h": {"env": ["X=1"]}}
    with pytest.raises(UserError, match="env: a mapping"):
        CalibrationConfig.from_params(params)


def test_a_workspace_passes_its_environment_to_the_stage_commands(tmp_path):
    repo = tmp_path / "repo"
    (repo / "models" / "demo").mkdir(parents=True)
    (repo / "dvc.yaml").write_text("stages:\n  ENV:\n    cmd: echo $MISTILL_PROBE > probe.txt\n    outs: [probe.txt]\n")
    data = {"demo": {"name": "demo", "models": {"dir": "models/demo", "threads": 2}, "distill": {"seeds": [0]}}}
    data["profile"] = data["demo"]
    config = CalibrationConfig(scratch=Path("s"), out=Path("o"), inputs=(), stages=("ENV",), results=(),
                               family_alpha=0.05, replicates=())
    ws = Workspace(repo / "s" / "e", Replicate("e", env=(("MISTILL_PROBE", "avx512"),)))
    ws.build(repo, data, config)
    ws.run_stages(stage_addresses(ws.root, config.stages), log=lambda line: None)
    assert (ws.root / "probe.txt").read_text().strip() == "avx512"


def test_a_workspace_copies_the_family_pipelines_and_runs_their_stages_in_the_root(tmp_path):
    """A stage of a family file (pipelines/<name>/dvc.yaml, wdir ../..) is copied with the root file and
    addressed through its file; it reads the workspace's params.yaml and writes beside the root's stage."""
    repo = tmp_path / "repo"
    (repo / "models" / "demo").mkdir(parents=True)
    (repo / "dvc.yaml").write_text("stages:\n  FIRST:\n    cmd: echo one > first.txt\n    outs: [first.txt]\n")
    (repo / "pipelines" / "family").mkdir(parents=True)
    (repo / "pipelines" / "family" / "dvc.yaml").write_text(
        "vars:\n  - ../../params.yaml\nstages:\n  SECOND:\n    wdir: ../..\n"
        "    cmd: cat first.txt > second.txt && echo ${profile.models.threads} >> second.txt\n"
        "    deps: [first.txt]\n    params: [profile.models.threads]\n    outs: [second.txt]\n")
    data = {"demo": {"name": "demo", "models": {"dir": "models/demo", "threads": 2}, "distill": {"seeds": [0]}}}
    data["profile"] = data["demo"]
    config = CalibrationConfig(scratch=Path("s"), out=Path("o"), inputs=(), stages=("FIRST", "SECOND"), results=(),
                               family_alpha=0.05, replicates=())
    ws = Workspace(repo / "s" / "f", Replicate("f", threads=1))
    ws.build(repo, data, config)
    targets = stage_addresses(ws.root, config.stages)
    assert targets == {"FIRST": "FIRST", "SECOND": "pipelines/family/dvc.yaml:SECOND"}
    ws.run_stages(targets, log=lambda line: None)
    assert (ws.root / "second.txt").read_text().split() == ["one", "1"]     # the replicate's one thread
    family_lock = yaml.safe_load((ws.root / "pipelines" / "family" / "dvc.lock").read_text())
    root_lock = yaml.safe_load((ws.root / "dvc.lock").read_text())
    assert set(family_lock["stages"]) == {"SECOND"} and set(root_lock["stages"]) == {"FIRST"}


def test_the_paper_profile_has_no_replicates_to_run():
    """Its expected values are the paper's printed ones; `calibrate run` says so instead of running."""
    from mistill.repro.replicates import run_replicates

    paper = CalibrationConfig.from_params(load_params(REPO / "params.yaml", profile="paper"))
    assert paper.replicates == () and paper.stages == CalibrationConfig.from_params(
        load_params(REPO / "params.yaml")).stages
    with pytest.raises(UserError, match="no replicates"):
        run_replicates(REPO, paper)


def _counting_repo(root: Path) -> tuple[Path, CalibrationConfig]:
    """A miniature DVC project whose one stage counts the lines of an input and writes it as a result."""
    repo = root / "repo"
    (repo / "artifacts" / "data").mkdir(parents=True)
    (repo / "artifacts" / "data" / "notes.jsonl").write_text('{"id": 1}\n')
    (repo / "models" / "demo").mkdir(parents=True)
    count = ("mkdir -p results && python -c \"import json; json.dump({'lines': len(open('artifacts/data/notes.jsonl')"
             ".readlines())}, open('results/R-X.json', 'w'))\"")
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"R-X": {
        "cmd": count, "deps": ["artifacts/data/notes.jsonl"], "outs": ["results/R-X.json"]}}}))
    (repo / "params.yaml").write_text("demo: &demo {name: demo, models: {dir: models/demo, threads: 2}, "
                                      "distill: {seeds: [0]}}\nprofile: *demo\n")
    config = CalibrationConfig(scratch=Path("scratch"), out=Path("out"), inputs=("artifacts/data",), stages=("R-X",),
                               results=("R-X",), family_alpha=0.05, replicates=(Replicate("one", threads=1),))
    return repo, config


def test_a_finished_replicate_is_reused_only_while_its_stages_are_up_to_date(tmp_path):
    """The replicate numbers of one chain are never reused for another: after an input changes (a re-bless writes
    new files), the next run reruns the stage that reads it instead of finding the replicate done."""
    import json
    import subprocess

    from mistill.repro.replicates import run_replicates

    repo, config = _counting_repo(tmp_path)
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=repo, check=True)
    logged: list[str] = []
    run_replicates(repo, config, log=logged.append)
    result = repo / "out" / "one" / "R-X.json"
    assert json.loads(result.read_text()) == {"lines": 1}

    logged.clear()
    run_replicates(repo, config, log=logged.append)
    assert logged == ["one: done earlier, every stage up to date (1 thread(s))"]

    notes = repo / "artifacts" / "data" / "notes.jsonl"
    notes.unlink()                                       # a new file, as a re-run stage writes it
    notes.write_text('{"id": 1}\n{"id": 2}\n{"id": 3}\n')
    logged.clear()
    run_replicates(repo, config, log=logged.append)
    assert logged[0] == "one: 1 thread(s)" and json.loads(result.read_text()) == {"lines": 3}


def test_a_replicate_leaves_out_the_results_it_does_not_read(tmp_path):
    """`not_read`: the result's reader stage never runs in the replicate's workspace, and its directory holds no
    numbers file of it (calibration.measure_spreads then measures the value over the other replicates)."""
    import dataclasses
    import subprocess

    from mistill.repro.replicates import run_replicates

    repo, config = _counting_repo(tmp_path)
    config = dataclasses.replace(config, replicates=(Replicate("seed", train_seed=1, not_read=("R-X",)),))
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=repo, check=True)
    run_replicates(repo, config, log=lambda line: None)
    assert (repo / "out" / "seed" / "replicate.json").is_file()
    assert not (repo / "out" / "seed" / "R-X.json").exists()
    assert not (repo / "scratch" / "seed" / "results" / "R-X.json").exists()

    params = load_params(REPO / "params.yaml")
    params["calibration"] = {**params["calibration"], "replicates": {"seed": {"train_seed": 1, "not_read": ["R-Q"]}}}
    with pytest.raises(UserError, match=r"calibration\.replicates\.seed\.not_read: R-Q not in calibration.results"):
        CalibrationConfig.from_params(params)
    params["calibration"] = {**params["calibration"], "held_out": {"later": {"threads": 0}}}
    params["calibration"]["replicates"] = {}
    with pytest.raises(UserError, match=r"calibration\.held_out\.later: weight_jitter >= 0 and threads >= 1"):
        CalibrationConfig.from_params(params)


def test_a_replicate_another_process_holds_is_left_to_it(tmp_path):
    """Several `calibrate run` processes share the replicates: each runs those no other one holds."""
    import dataclasses
    import subprocess

    from filelock import FileLock

    from mistill.repro.replicates import run_replicates

    repo, config = _counting_repo(tmp_path)
    config = dataclasses.replace(config, replicates=(Replicate("one", threads=1), Replicate("two", threads=2)))
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=repo, check=True)
    (repo / "scratch").mkdir()
    logged: list[str] = []
    with FileLock(repo / "scratch" / "one.lock"):              # another process is running replicate one
        done = run_replicates(repo, config, log=logged.append)
    assert set(done) == {"two"} and "one: running in another process, left to it" in logged
    assert not (repo / "out" / "one").exists()
    done = run_replicates(repo, config, log=logged.append)     # it ended (here: without finishing)
    assert set(done) == {"one", "two"} and (repo / "out" / "one" / "R-X.json").exists()
    logged.clear()
    assert set(run_replicates(repo, config, config.replicates[1:], log=logged.append)) == {"two"}   # those asked for
    assert logged == ["two: done earlier, every stage up to date (2 thread(s))"]


def test_a_refreshed_workspace_keeps_its_dvc_state_and_a_half_built_one_starts_over(tmp_path):
    repo, config = _counting_repo(tmp_path)
    data = load_all(repo / "params.yaml")
    ws = Workspace(repo / "scratch" / "one", config.replicates[0])
    ws.build(repo, data, config)
    targets = stage_addresses(ws.root, config.stages)
    assert not ws.up_to_date(targets)
    ws.run_stages(targets, log=lambda line: None)
    ws.build(repo, data, config)                         # a second run lays it out again over the same state
    assert ws.up_to_date(targets)

    (ws.root / ".dvc").rename(ws.root / "dvc-gone")      # killed before `dvc init`: nothing of it is kept
    ws.build(repo, data, config)
    assert not (ws.root / "dvc-gone").exists() and not (ws.root / "results").exists()
    assert not ws.up_to_date(targets)


def test_a_replicate_runs_the_family_items_it_names_and_no_other(tmp_path):
    """calibration.stages may name one item of a family stage (`COUNT@first`): the replicate runs that item alone,
    through the family runner as the family stage would, reads its result, and finds it up to date next time."""
    import json
    import subprocess

    from mistill.repro.replicates import FamilyItemTarget, calibration_targets, run_replicates

    repo, config = _counting_repo(tmp_path)
    (repo / "pipelines" / "counts").mkdir(parents=True)
    count = ("mkdir -p artifacts/counts && python -c \"import json; json.dump({'lines': len(open('artifacts/data/"
             "notes.jsonl').readlines()) * ${item}}, open('artifacts/counts/${key}.json', 'w'))\"")
    (repo / "pipelines" / "counts" / "families.yaml").write_text(yaml.safe_dump({"stages": {"COUNT": {
        "foreach": {"first": 1, "second": 2},
        "do": {"wdir": "../..", "cmd": count, "deps": ["artifacts/data/notes.jsonl"],
               "outs": [{"artifacts/counts/${key}.json": {"persist": True}}]}}}}))
    (repo / "pipelines" / "counts" / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"COUNT": {
        "wdir": "../..", "cmd": "mistill repro family pipelines/counts/families.yaml COUNT",
        "deps": ["pipelines/counts/families.yaml", "artifacts/data/notes.jsonl"],
        "outs": [{"artifacts/counts": {"persist": True}}]}}}))
    read = ("mkdir -p results && cp artifacts/counts/first.json results/R-X.json")
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"R-X": {
        "cmd": read, "deps": ["artifacts/counts/first.json"], "outs": ["results/R-X.json"]}}}))
    config = dataclasses.replace(config, stages=("COUNT@first", "R-X"))
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=repo, check=True)
    assert calibration_targets(repo, config.stages) == {
        "COUNT@first": FamilyItemTarget("pipelines/counts/families.yaml", "COUNT", "COUNT@first"), "R-X": "R-X"}
    assert stage_outs(repo, config.stages)["COUNT@first"] == ["artifacts/counts/first.json"]
    assert stage_deps(repo, ("COUNT@first",)) == {"COUNT@first": ["artifacts/data/notes.jsonl"]}
    logged: list[str] = []
    run_replicates(repo, config, log=logged.append)
    workspace = repo / "scratch" / "one"
    assert json.loads((repo / "out" / "one" / "R-X.json").read_text()) == {"lines": 1}
    assert not (workspace / "artifacts" / "counts" / "second.json").exists()     # the item no stage names
    logged.clear()
    run_replicates(repo, config, log=logged.append)
    assert logged == ["one: done earlier, every stage up to date (1 thread(s))"]
