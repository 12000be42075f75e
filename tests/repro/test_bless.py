"""Blessing demo goldens: provenance recorded, changes printed, the paper's values never overwritten."""

from pathlib import Path

import pytest
import yaml

from mistill.cli import main
from mistill.repro.machine import cpu_model
from mistill.repro.registry import load_registry
from tests.repro.repro_helpers import commit_all, write_fixture

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def demo_values(**kv):
    return {k: {"value": v, "statistic": "count", "artifact": "artifacts/HD-001"} for k, v in kv.items()}


def test_bless_then_check_then_drift(git_root, monkeypatch, capsys):
    monkeypatch.chdir(git_root)
    results = git_root / "results"
    write_fixture(results, "R-C1", demo_values(p1_event_count=41, median_p1_margin=3.2071), profile="demo")
    assert main(["repro", "bless", "R-C1", "--profile", "demo", "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert "R-C1.p1_event_count: - -> 41" in out

    data = yaml.load((results / "expected" / "demo.yaml").read_text(), Loader=LOADER)
    golden = data["expected"]["R-C1"]
    assert golden["p1_event_count"] == {"value": 41, "stat": "count", "kind": "count", "class": "none"}
    assert golden["median_p1_margin"]["kind"] == "nats" and golden["median_p1_margin"]["class"] == "K"
    prov = data["provenance"]["R-C1"]
    assert set(prov) == {"code_version", "params_sha256", "reader", "numbers_sha256", "machine", "date"}
    assert cpu_model() in prov["machine"]       # goldens of trained students hold only within a CPU type
    assert "Goldens made by" in (git_root / "REGISTRY.md").read_text()

    check = ["repro", "check", "R-C1", "--profile", "demo", "--results", str(results)]
    assert main(check) == 0
    # Margin within K's 0.14 nats passes; an off-by-one count (exact, class none) fails.
    write_fixture(results, "R-C1", demo_values(p1_event_count=41, median_p1_margin=3.3), profile="demo")
    assert main(check) == 0
    write_fixture(results, "R-C1", demo_values(p1_event_count=42, median_p1_margin=3.3), profile="demo")
    capsys.readouterr()
    assert main(check) == 1
    assert "p1_event_count" in next(l for l in capsys.readouterr().out.splitlines() if "FAIL" in l)

    # Re-blessing over that breach needs a reason.
    assert main(["repro", "bless", "R-C1", "--profile", "demo", "--results", str(results),
                 "--accept-breach", "recount after the event-window fix"]) == 0
    assert "R-C1.p1_event_count: 41 -> 42" in capsys.readouterr().out


def test_hand_set_tolerance_survives_rebless(git_root, monkeypatch):
    monkeypatch.chdir(git_root)
    results = git_root / "results"
    write_fixture(results, "R-C1", demo_values(median_p1_margin=3.2), profile="demo")
    main(["repro", "bless", "R-C1", "--profile", "demo", "--results", str(results)])
    path = results / "expected" / "demo.yaml"
    data = yaml.load(path.read_text(), Loader=LOADER)
    data["expected"]["R-C1"]["median_p1_margin"]["tolerance"] = {"absolute": 0.5}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    main(["repro", "bless", "R-C1", "--profile", "demo", "--results", str(results)])
    tol = load_registry(git_root).expected("demo").values["R-C1"]["median_p1_margin"].tolerance
    assert tol.absolute == 0.5


def _blessed_and_marked_descriptive(git_root, margin) -> Path:
    """R-C1 blessed with `median_p1_margin` at `margin`, then marked descriptive in [-5, 5] by hand; the
    results directory."""
    results = git_root / "results"
    write_fixture(results, "R-C1", demo_values(median_p1_margin=margin), profile="demo")
    main(["repro", "bless", "R-C1", "--profile", "demo", "--results", str(results)])
    path = results / "expected" / "demo.yaml"
    data = yaml.load(path.read_text(), Loader=LOADER)
    data["expected"]["R-C1"]["median_p1_margin"]["descriptive"] = {"range": [-5.0, 5.0], "why": "set by hand"}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    commit_all(git_root)
    return results


def test_hand_set_descriptive_mark_survives_rebless(git_root, monkeypatch):
    """A value marked descriptive by hand (no tolerance of its own: not yet measured by the replicates)."""
    monkeypatch.chdir(git_root)
    results = _blessed_and_marked_descriptive(git_root, 3.2)
    write_fixture(results, "R-C1", demo_values(median_p1_margin=3.3), profile="demo")
    assert main(["repro", "bless", "R-C1", "--profile", "demo", "--results", str(results)]) == 0
    kept = load_registry(git_root).expected("demo").values["R-C1"]["median_p1_margin"]
    assert kept.value == 3.3 and kept.descriptive == (-5.0, 5.0) and kept.descriptive_why == "set by hand"


def rebless_after_editing(git_root, key: str, edit: dict, **second_run):
    """Bless R-C1 from a first run, edit `key`'s golden entry by hand (`edit`), then re-bless from a second
    run (`second_run` overrides the first's values): the goldens the re-bless leaves, and the key's class
    before the edit."""
    results = git_root / "results"
    write_fixture(results, "R-C1", demo_values(median_p1_margin=3.2, p1_event_count=41), profile="demo")
    main(["repro", "bless", "R-C1", "--profile", "demo", "--results", str(results)])
    path = results / "expected" / "demo.yaml"
    data = yaml.load(path.read_text(), Loader=LOADER)
    cited = data["expected"]["R-C1"][key]["class"]
    data["expected"]["R-C1"][key].update(edit)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    write_fixture(results, "R-C1", demo_values(**{"median_p1_margin": 3.2, "p1_event_count": 41, **second_run}),
                  profile="demo")
    assert main(["repro", "bless", "R-C1", "--profile", "demo", "--results", str(results),
                 "--accept-breach", "recount"]) == 0
    return load_registry(git_root).expected("demo").values["R-C1"], cited


def test_rebless_keeps_an_invariants_expected_value(git_root, monkeypatch):
    """An invariant (e.g. all-heads knock-in minus clean margin = 0) stays the invariant, not the last
    run's rounding error; other values move with the run."""
    monkeypatch.chdir(git_root)
    golden, _ = rebless_after_editing(
        git_root, "median_p1_margin", {"value": 0.0, "tolerance": {"absolute": 1e-4, "basis": "invariant (by construction)"}},
        median_p1_margin=2e-5, p1_event_count=42)
    assert golden["median_p1_margin"].value == 0.0 and golden["median_p1_margin"].tolerance.absolute == 1e-4
    assert golden["p1_event_count"].value == 42


def test_rebless_keeps_a_tolerance_of_its_own_with_the_class_it_cites(git_root, monkeypatch):
    """R-D20's shares: the paper holds them exact (class none) given stored patches, the demo recomputes the
    patches and holds them to K. A re-bless moves the value and keeps the tolerance and its class."""
    monkeypatch.chdir(git_root)
    golden, cited = rebless_after_editing(
        git_root, "p1_event_count", {"class": "T", "tolerance": {"absolute": 3, "basis": "T: recomputed"}},
        p1_event_count=50)
    assert cited != "T"
    assert golden["p1_event_count"].value == 50 and golden["p1_event_count"].cls == "T"
    assert golden["p1_event_count"].tolerance.absolute == 3 and golden["p1_event_count"].tolerance.basis == "T: recomputed"


def test_paper_values_cannot_be_blessed(scratch_root, registry, monkeypatch, capsys):
    from tests.repro.repro_helpers import paper_values

    monkeypatch.chdir(scratch_root)
    results = scratch_root / "results"
    write_fixture(results, "R-C3", paper_values(registry, "R-C3"))
    before = (results / "expected" / "paper.yaml").read_text()
    assert main(["repro", "bless", "R-C3", "--profile", "paper", "--results", str(results)]) == 2
    assert "blessable: false" in capsys.readouterr().err
    assert (results / "expected" / "paper.yaml").read_text() == before


def test_bless_of_a_missing_numbers_file_is_a_user_error(git_root, monkeypatch, capsys):
    monkeypatch.chdir(git_root)
    assert main(["repro", "bless", "R-C2", "--profile", "demo", "--results", str(git_root / "results")]) == 2
    assert "no such numbers file" in capsys.readouterr().err
    assert not (git_root / "results" / "expected" / "demo.yaml").exists()


@pytest.mark.parametrize("ids", [["R-C99"]])
def test_bless_unknown_id(scratch_root, monkeypatch, capsys, ids):
    monkeypatch.chdir(scratch_root)
    assert main(["repro", "bless", *ids, "--profile", "demo", "--results", str(scratch_root / "results")]) == 2
    assert "unknown result id" in capsys.readouterr().err


def test_extra_keys_let_a_demo_reader_record_an_invariant(git_root, monkeypatch):
    from mistill.repro.numbers import write_numbers

    path = git_root / "registry.yaml"
    data = yaml.safe_load(path.read_text())
    data["results"]["R-C2"]["extra_keys"] = [*data["results"]["R-C2"].get("extra_keys", []),
                                             "all_heads_knockin_recovery"]
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    commit_all(git_root)
    registry = load_registry(git_root)
    assert registry.registered_keys("R-C2")[-1] == "all_heads_knockin_recovery"
    values = {"all_heads_knockin_recovery": {"value": 1.0, "statistic": "median over events", "artifact": "a"}}
    out = write_numbers("R-C2", values, reader="r", inputs=[], params={"profile": "demo"},
                        results_dir=git_root / "results", registry=registry)
    assert out.exists()
    monkeypatch.chdir(git_root)
    assert main(["repro", "bless", "R-C2", "--profile", "demo", "--results", str(git_root / "results")]) == 0
    assert main(["repro", "check", "R-C2", "--profile", "demo", "--results", str(git_root / "results")]) == 0
    assert "`all_heads_knockin_recovery`" in (git_root / "REGISTRY.md").read_text()


def test_rebless_of_a_descriptive_list_of_intervals_checks_every_number(git_root, monkeypatch):
    """A descriptive per-seed list of intervals (a list of lists) is re-blessed; its range grows to hold a
    number outside it."""
    monkeypatch.chdir(git_root)
    results = _blessed_and_marked_descriptive(git_root, [[1.0, 2.0], [3.0, 4.0]])
    write_fixture(results, "R-C1", demo_values(median_p1_margin=[[1.0, 2.0], [6.0, 7.0]]), profile="demo")
    assert main(["repro", "bless", "R-C1", "--profile", "demo", "--results", str(results),
                 "--accept-breach", "a seed's interval moved"]) == 0
    low, high = load_registry(git_root).expected("demo").values["R-C1"]["median_p1_margin"].descriptive
    assert low <= -5.0 and high >= 7.0
