import re

import pytest
import yaml

from mistill.errors import UserError
from mistill.repro.macros import macro_name, number_words
from mistill.repro.registry import ALL_IDS, load_registry
from tests.repro.repro_helpers import SHARED_SPEC


def test_all_62_results_registered_with_every_field(registry):
    assert list(registry.results) == list(ALL_IDS) and len(ALL_IDS) == 62
    for result in registry.results.values():
        assert result.stage == result.id
        assert result.status in registry.statuses
        assert result.reader.startswith("readers/") and result.data and result.params
        assert set(result.nondeterminism) <= {"G", "K", "T", "F", "none"}
        assert registry.expected("paper").values[result.id], f"{result.id} has no paper values"


def test_paper_only_results_are_marked_paper(registry):
    # Other datasets can never run on the demo ...
    for rid in ("R-D37", "R-D41", "R-D46"):
        assert registry.results[rid].status == "paper"
    # ... while the human-in-the-loop results run on it with the note generator's labels and flips
    for rid in ("R-C9", "R-D33", "R-D34", "R-D35"):
        assert registry.results[rid].status == "demo"


def test_default_tolerances_follow_class_and_kind(registry):
    paper = registry.expected("paper").values
    # K share, printed 0.62: 0.02 (K) + 0.005 (half the last printed digit); relative 2.5%.
    tol = paper["R-C3"]["necessity_top8_p1"].tolerance
    assert tol.absolute == pytest.approx(0.025) and tol.relative == pytest.approx(0.025)
    assert tol.cls == "K"
    # K nats: three s.d. of the 0.046-nat forward noise, plus 0.005 rounding.
    assert paper["R-C1"]["median_p1_margin"].tolerance.absolute == pytest.approx(0.145)
    # Counts the paper calls exact given stored traces: exact, class none.
    count = paper["R-C1"]["p1_event_count"]
    assert count.tolerance.exact and count.cls == "none"
    # A value with the paper's 95% interval around it: that interval.
    assert paper["R-D2"]["qwen_vanilla_minus_untrained"].tolerance.interval == (0.063, 0.101)
    # Several classes (G, T): the loosest default, G's 0.025, plus 0.0005 rounding of 0.187.
    assert paper["R-D2"]["qwen_vanilla_fp32_microf1"].tolerance.absolute == pytest.approx(0.0255)


def test_entry_tolerance_overrides_default(scratch_root):
    path = scratch_root / "results" / "expected" / "paper.yaml"
    data = yaml.safe_load(path.read_text())
    data["expected"]["R-C3"]["necessity_top8_p1"]["tolerance"] = {"relative": 0.5}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    tol = load_registry(scratch_root).expected("paper").values["R-C3"]["necessity_top8_p1"].tolerance
    assert tol.relative == 0.5 and tol.absolute == pytest.approx(0.005)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["results"]["R-C1"].update(status="done"), "status 'done'"),
    (lambda d: d["results"].pop("R-D46"), "missing R-D46"),
    (lambda d: d["results"]["R-C2"].update(stage="attribution"), "named exactly after the id"),
    (lambda d: d["results"]["R-C2"].update(nondeterminism=["X"]), "nondeterminism"),
])
def test_malformed_registry_is_one_clear_line(scratch_root, edit, message):
    path = scratch_root / "registry.yaml"
    data = yaml.safe_load(path.read_text())
    edit(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(UserError) as err:
        load_registry(scratch_root)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_unknown_id_is_a_user_error(registry):
    with pytest.raises(UserError, match="unknown result id 'R-C16'"):
        registry.get("R-C16")


@pytest.mark.skipif(not SHARED_SPEC.exists(), reason="../shared/spec/paper_registry.yaml not present")
def test_paper_expected_values_equal_the_papers_transcription(registry):
    spec = yaml.safe_load(SHARED_SPEC.read_text())
    paper = registry.expected("paper").values
    assert [r["id"] for r in spec["results"]] == list(paper)
    for entry in spec["results"]:
        ours = paper[entry["id"]]
        assert list(ours) == [item["name"] for item in entry["expected"]], entry["id"]
        for item in entry["expected"]:
            exp = ours[item["name"]]
            assert exp.value == item["value"] and exp.stat == item["stat"], (entry["id"], item["name"])
            for extra in ("interval", "p", "higher", "lower", "ties", "n"):
                assert exp.reported.get(extra) == item.get(extra), (entry["id"], item["name"], extra)
        assert registry.results[entry["id"]].nondeterminism == entry["nondeterminism"]


def test_number_words_hand_worked():
    assert number_words(0) == "zero" and number_words(40) == "forty" and number_words(46) == "fortysix"
    assert number_words(101) == "onehundredone" and number_words(1861) == "onethousandeighthundredsixtyone"


def test_macro_names_are_letters_only_stable_and_unique(registry):
    assert macro_name("R-C3", "knockin_top40_p1") == "RCthreeKnockinTopFortyPOne"
    assert macro_name("R-D22", "val_microf1_lambda001_vs_003") == "RDtwentytwoValMicrofOneLambdaZeroZeroOneVsZeroZeroThree"
    assert macro_name("R-D46", "seed_pair_medians", 1) == "RDfortysixSeedPairMediansPartTwo"
    names = [macro_name(rid, key) for rid in registry.results for key in registry.registered_keys(rid)]
    paper_keys = sum(len(v) for v in registry.expected("paper").values.values())
    assert len(names) == len(set(names)) >= paper_keys == 774
    assert all(re.fullmatch(r"[A-Za-z]+", n) for n in names)


def test_a_key_named_twice_in_one_mapping_is_refused_naming_it(tmp_path):
    """YAML keeps the second of two equal keys; a result's second `extra_keys:` would drop its first list."""
    from mistill.repro.registry import _load_yaml

    path = tmp_path / "registry.yaml"
    path.write_text("results:\n  R-C1:\n    extra_keys: [a, b]\n    status: demo\n    extra_keys: [c]\n")
    with pytest.raises(UserError, match=r"line 5 not valid YAML \(key 'extra_keys' appears twice"):
        _load_yaml(path)
    # a merge key overrides by design
    path.write_text("base: &b {status: demo}\nresults:\n  R-C1:\n    <<: *b\n    status: paper\n")
    assert _load_yaml(path)["results"]["R-C1"] == {"status": "paper"}
