"""The rehearsal profile is the paper profile's structure at CPU sizes, checked against the paper's values."""

from __future__ import annotations

import pytest

from mistill.errors import UserError
from mistill.params import load_all
from mistill.repro.bless import bless
from mistill.repro.registry import load_registry
from tests.repro.repro_helpers import REPO

# What the rehearsal must share with the paper, value for value: loaders, models and how they are loaded,
# generation backend, arms, seeds, objective terms, the own-heads rows, the privacy rules.
SAME = [
    ("world", "inventory", "source"), ("world", "notes", "source"), ("world", "shortlist", "encoder"),
    ("models", "teacher"), ("models", "student_qwen"), ("models", "student_smol"), ("models", "dtype"),
    ("models", "revision"), ("models", "rope_scaling"), ("models", "generation_backend"), ("models", "vllm"),
    ("models", "attn_implementation"), ("models", "generation_attn_implementation"), ("decoding", "temperature"),
    ("decoding", "top_p"), ("decoding", "top_k"), ("distill", "students"), ("distill", "vanilla_precisions"),
    ("distill", "mistill_precisions"), ("distill", "precision"), ("distill", "seeds"), ("distill", "terms"),
    ("distill", "heads"), ("distill", "train", "gradient_checkpointing"), ("distill", "train", "offload_checkpoints"),
    ("evaluate", "ks"), ("evaluate", "own_heads", "arms"), ("evaluate", "own_heads", "readside_phases"),
    ("instrument", "knockin", "min_range"), ("instrument", "events", "unknown_codes"), ("privacy",), ("seeds",),
]


def keys(tree, path=()):
    if not isinstance(tree, dict):
        return set()
    return {path + (k,) for k in tree} | {p for k, v in tree.items() for p in keys(v, path + (k,))}


def at(tree, path):
    for key in path:
        tree = tree[key]
    return tree


@pytest.fixture(scope="module")
def profiles():
    data = load_all(REPO / "params.yaml")
    return data["paper"], data["rehearsal"]


def test_rehearsal_has_every_key_of_the_paper_profile_and_no_other(profiles):
    paper, rehearsal = profiles
    assert keys(rehearsal) == keys(paper)


@pytest.mark.parametrize("path", SAME, ids=".".join)
def test_rehearsal_keeps_the_papers_loaders_models_arms_and_seeds(profiles, path):
    paper, rehearsal = profiles
    assert at(rehearsal, path) == at(paper, path)


def test_rehearsal_reads_no_real_mimic_file_and_writes_its_own_pins(profiles):
    paper, rehearsal = profiles
    assert rehearsal["distill"]["seeds"] == [0, 1, 2]
    assert rehearsal["world"]["source_dir"] != paper["world"]["source_dir"]
    assert not set(rehearsal["world"]["mimiciv"].values()) & set(paper["world"]["mimiciv"].values()) - {None}
    assert rehearsal["models"]["dir"] != paper["models"]["dir"]


def test_rehearsal_is_checked_against_the_papers_values(tmp_path):
    registry = load_registry(REPO)
    assert registry.expected_source("rehearsal") == "paper"
    assert registry.expected("rehearsal") is registry.expected("paper")
    assert "rehearsal" not in registry.value_profiles
    with pytest.raises(UserError, match="no goldens of its own"):
        bless(registry, ["R-D1"], profile="rehearsal", results_dir=tmp_path)


def test_expected_from_must_name_a_profile_with_values(tmp_path):
    text = (REPO / "registry.yaml").read_text().replace("expected_from: paper", "expected_from: nowhere")
    (tmp_path / "registry.yaml").write_text(text)
    with pytest.raises(UserError, match="expected_from must name a profile"):
        load_registry(tmp_path)
