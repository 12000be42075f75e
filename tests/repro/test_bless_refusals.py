"""What `mistill repro bless` refuses: a breach without a reason, a dirty tree, numbers read from other artifacts."""

import json

import pytest
import yaml

from mistill.cli import main
from mistill.repro.numbers import hash_inputs
from tests.repro.repro_helpers import commit_all, write_fixture

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def demo_values(**kv):
    return {k: {"value": v, "statistic": "count", "artifact": "artifacts/HD-001"} for k, v in kv.items()}


def bless(root, *ids, reason=None):
    args = ["repro", "bless", *ids, "--profile", "demo", "--results", str(root / "results")]
    return main(args + (["--accept-breach", reason] if reason is not None else []))


def goldens(root):
    return yaml.load((root / "results" / "expected" / "demo.yaml").read_text(), Loader=LOADER)


@pytest.fixture
def blessed(git_root, monkeypatch):
    """R-C1 blessed once with 322 P1 events (exact, class none) and a 6.02-nat median margin (K, ±0.14)."""
    monkeypatch.chdir(git_root)
    write_fixture(git_root / "results", "R-C1", demo_values(p1_event_count=322, median_p1_margin=6.02),
                  profile="demo")
    assert bless(git_root, "R-C1") == 0
    return git_root


def test_a_breach_is_refused_without_a_reason(blessed, capsys):
    before = (blessed / "results" / "expected" / "demo.yaml").read_text()
    write_fixture(blessed / "results", "R-C1", demo_values(p1_event_count=999, median_p1_margin=6.02),
                  profile="demo")
    capsys.readouterr()
    assert bless(blessed, "R-C1") == 2
    err = capsys.readouterr().err.strip()
    assert err == ('mistill: error: bless: 1 value(s) breach the current goldens, e.g. R-C1.p1_event_count 322 -> 999 '
                   '(exact); rerun, or bless with --accept-breach "<why the numbers moved>"')
    assert (blessed / "results" / "expected" / "demo.yaml").read_text() == before


def test_a_move_within_tolerance_is_not_a_breach(blessed):
    write_fixture(blessed / "results", "R-C1", demo_values(p1_event_count=322, median_p1_margin=6.15),
                  profile="demo")
    assert bless(blessed, "R-C1") == 0
    assert goldens(blessed)["expected"]["R-C1"]["median_p1_margin"]["value"] == 6.15
    assert "accepted_breach" not in goldens(blessed)["provenance"]["R-C1"]


def test_an_accepted_breach_records_its_reason_in_the_provenance(blessed, capsys):
    write_fixture(blessed / "results", "R-C1", demo_values(p1_event_count=999, median_p1_margin=6.5),
                  profile="demo")
    capsys.readouterr()
    assert bless(blessed, "R-C1", reason="events now counted over both trace halves") == 0
    out = capsys.readouterr().out
    assert "R-C1.p1_event_count: 322 -> 999" in out
    assert "R-C1: accepted 2 breach(es) (events now counted over both trace halves)" in out
    data = goldens(blessed)
    assert data["expected"]["R-C1"]["p1_event_count"]["value"] == 999
    prov = data["provenance"]["R-C1"]
    assert prov["accepted_breach"] == "events now counted over both trace halves"
    assert prov["breached"] == ("R-C1.p1_event_count 322 -> 999 (exact); "
                                "R-C1.median_p1_margin 6.02 -> 6.5 (±0.14)")
    # The next blessing without a breach carries no stale reason.
    assert bless(blessed, "R-C1") == 0
    assert "accepted_breach" not in goldens(blessed)["provenance"]["R-C1"]


def test_a_dropped_value_is_a_breach(blessed, capsys):
    write_fixture(blessed / "results", "R-C1", demo_values(p1_event_count=322), profile="demo")
    assert bless(blessed, "R-C1") == 2
    assert "R-C1.median_p1_margin 6.02 -> (not in the numbers file)" in capsys.readouterr().err


def test_an_empty_reason_is_refused(blessed, capsys):
    write_fixture(blessed / "results", "R-C1", demo_values(p1_event_count=999, median_p1_margin=6.02),
                  profile="demo")
    assert bless(blessed, "R-C1", reason="  ") == 2
    assert "--accept-breach needs a reason" in capsys.readouterr().err
    assert goldens(blessed)["expected"]["R-C1"]["p1_event_count"]["value"] == 322


def test_a_dirty_tree_is_refused_naming_how_many_files(git_root, monkeypatch, capsys):
    monkeypatch.chdir(git_root)
    (git_root / "src").mkdir()
    (git_root / "src" / "reader.py").write_text("A = 1\n")
    (git_root / "dvc.lock").write_text("schema: '2.0'\n")
    (git_root / "pipelines" / "distill").mkdir(parents=True)
    (git_root / "pipelines" / "distill" / "dvc.yaml").write_text("stages: {}\n")
    (git_root / "pipelines" / "distill" / "dvc.lock").write_text("schema: '2.0'\n")
    commit_all(git_root)
    (git_root / "src" / "reader.py").write_text("A = 2\n")
    (git_root / "registry.yaml").write_text((git_root / "registry.yaml").read_text() + "\n# edited\n")
    # What the pipeline writes is not code: a rerun's dvc.lock and numbers files do not make the tree dirty.
    (git_root / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    (git_root / "pipelines" / "distill" / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    write_fixture(git_root / "results", "R-C1", demo_values(p1_event_count=322), profile="demo")
    capsys.readouterr()
    assert bless(git_root, "R-C1") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "bless: 2 tracked file(s) have uncommitted changes" in err and "+dirty" in err
    assert not (git_root / "results" / "expected" / "demo.yaml").exists()
    commit_all(git_root)
    assert bless(git_root, "R-C1") == 0


def test_outside_a_git_work_tree_bless_refuses(scratch_root, monkeypatch, capsys):
    monkeypatch.chdir(scratch_root)
    write_fixture(scratch_root / "results", "R-C1", demo_values(p1_event_count=322), profile="demo")
    assert bless(scratch_root, "R-C1") == 2
    assert "is not a git work tree with a commit" in capsys.readouterr().err


def with_inputs(path, inputs):
    record = json.loads(path.read_text())
    record["inputs"] = inputs
    path.write_text(json.dumps(record))


def test_numbers_read_from_other_artifacts_are_refused(git_root, monkeypatch, capsys):
    monkeypatch.chdir(git_root)
    events = git_root / "artifacts" / "HD-001" / "n00007-0" / "events.jsonl"
    events.parent.mkdir(parents=True)
    events.write_text('{"phase": "P1", "margin": 6.02}\n')
    numbers = write_fixture(git_root / "results", "R-C1", demo_values(p1_event_count=322), profile="demo")
    with_inputs(numbers, hash_inputs(["artifacts/HD-001"]))
    assert bless(git_root, "R-C1") == 0                     # the artifacts on disk are the ones read

    events.write_text('{"phase": "P1", "margin": 6.5}\n')
    capsys.readouterr()
    assert bless(git_root, "R-C1") == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"mistill: error: bless: {numbers} was read from another artifacts/HD-001 than "
                   "the one on disk (sha256 differs); rerun `dvc repro R-C1`")

    events.unlink()
    events.parent.rmdir()
    (git_root / "artifacts" / "HD-001").rmdir()
    assert bless(git_root, "R-C1") == 2
    assert "was read from artifacts/HD-001, which is missing" in capsys.readouterr().err
