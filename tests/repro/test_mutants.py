"""Mutants: their params overrides, their configuration, and the check that names what fails."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest

from mistill.errors import UserError
from mistill.params import load_params
from mistill.repro.mutants import MutantOutcome, MutantsConfig, check_mutant, mutant, outcome_table
from mistill.repro.replicates import replicate_params

REPO = Path(__file__).resolve().parents[2]


def test_a_mutant_s_overrides_set_and_remove_dotted_keys_of_the_active_profile():
    section = {"distill": {"heads": "top", "lambda_from": "bf16", "terms": ["attn", "inter"]}, "models": {}}
    data = {"demo": section, "profile": section}
    got = replicate_params(data, mutant("m", {"distill.heads": "random", "distill.lambda_from": None,
                                              "distill.terms": []}))
    assert got["profile"]["distill"] == {"heads": "random", "terms": []}
    assert got["profile"] is got["demo"]                  # the alias still names the one active section
    assert data["profile"]["distill"]["heads"] == "top"   # the checkout's params untouched
    with pytest.raises(UserError, match="no section 'nowhere'"):
        replicate_params(data, mutant("m", {"nowhere.key": 1}))


def test_every_profile_s_mutants_are_configured_and_link_what_they_cannot_reach():
    for profile in ("demo", "paper", "rehearsal"):
        config = MutantsConfig.from_params(load_params(REPO / "params.yaml", profile=profile))
        assert {r.name for r in config.replicates} == {"lambda0", "random_heads", "other_notes", "shifted_layers"}
        assert set(config.headline) <= set(config.results)
    config = MutantsConfig.from_params(load_params(REPO / "params.yaml", profile="demo")).with_kept_outputs(REPO)
    assert "artifacts/DT-000/student-qwen-vanilla-bf16-s0" in config.inputs   # Vanilla is linked, not retrained
    assert not any("mistill" in i for i in config.inputs)                    # Mistill's outputs are the mutant's own


@pytest.mark.parametrize("section, message", [
    (None, "no `mutants` section"),
    ({"scratch": "s", "out": "o", "inputs": [], "stages": [], "results": ["R-D5"], "headline": ["R-D6"],
      "runs": {"a": {"distill.heads": "random"}}}, "not in mutants.results"),
    ({"scratch": "s", "out": "o", "inputs": [], "stages": [], "results": ["R-D5"], "headline": ["R-D5"],
      "runs": {"a": {}}}, "non-empty mapping"),
])
def test_bad_mutants_sections_are_refused(section, message):
    with pytest.raises(UserError, match=message):
        MutantsConfig.from_params({"mutants": section} if section else {})


def test_the_check_of_a_mutant_names_the_keys_it_moves(tmp_path):
    """The committed numbers pass; the same files with one R-D6 gap flipped in sign and one R-D18 value
    out of range fail on exactly those keys, R-D6's as a headline."""
    config = MutantsConfig.from_params(load_params(REPO / "params.yaml", profile="demo"))
    for rid in config.results:
        shutil.copy2(REPO / "results" / f"{rid}.json", tmp_path / f"{rid}.json")
    clean = check_mutant("none", {}, tmp_path, config, "demo", 0.0)
    assert clean.failing == {} and not clean.caught

    def move(rid, key, change):
        path = tmp_path / f"{rid}.json"
        body = json.loads(path.read_text())
        body["values"][key]["value"] = change(copy.deepcopy(body["values"][key]["value"]))
        path.write_text(json.dumps(body))

    move("R-D6", "qwen_mistill_minus_bf16_vanilla_p2c", lambda v: -v - 1.0)
    move("R-D18", "corpus_microf1_mistill_minus_bf16_vanilla", lambda v: v + 5.0)   # past any F1 difference
    moved = check_mutant("flipped", {"x": 1}, tmp_path, config, "demo", 1.0)
    assert moved.failing == {"R-D6": ["qwen_mistill_minus_bf16_vanilla_p2c"],
                             "R-D18": ["corpus_microf1_mistill_minus_bf16_vanilla"]}
    assert moved.headline_failing == ["R-D6 qwen_mistill_minus_bf16_vanilla_p2c"] and moved.caught
    table = outcome_table([clean, moved])
    assert "| none |  | NO | - |" in table
    assert "| flipped | x=1 | yes | R-D6 qwen_mistill_minus_bf16_vanilla_p2c, R-D18 corpus_microf1" in table


def test_an_outcome_without_headline_failures_is_not_caught():
    assert not MutantOutcome("m", {}, {"R-D18": ["k"]}, [], 0.0).caught


def test_a_record_of_some_mutants_keeps_the_others(tmp_path):
    from mistill.io import read_json
    from mistill.repro.mutants import write_record

    path = tmp_path / "mutants.json"
    write_record(path, [MutantOutcome("a", {"x": 1}, {}, [], 1.0), MutantOutcome("b", {"y": 2}, {"R-D6": ["k"]},
                                                                                   ["R-D6 k"], 2.0)], "demo")
    write_record(path, [MutantOutcome("b", {"y": 2}, {}, [], 3.0), MutantOutcome("c", {"z": 3}, {}, [], 4.0)], "demo")
    body = read_json(path, "record")
    assert [(m["name"], m["caught"], m["wall_s"]) for m in body["mutants"]] == [("a", False, 1.0), ("b", False, 3.0),
                                                                               ("c", False, 4.0)]
