"""REGISTRY.md: all 62 ids with their expected values, regenerated and checked for staleness."""

import re

import pytest
import yaml

from mistill.cli import main
from mistill.repro.check import fmt_value
from mistill.repro.registry import ALL_IDS, load_registry
from mistill.repro.registry_md import render_registry_md
from tests.repro.repro_helpers import REPO, SHARED_SPEC

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def sections(text):
    """id -> that entry's text."""
    parts = re.split(r"^## (R-[CD]\d+)\n", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def test_committed_registry_md_is_current(registry):
    assert (REPO / "REGISTRY.md").read_text() == render_registry_md(registry)


@pytest.mark.skipif(not SHARED_SPEC.exists(), reason="../shared/spec/paper_registry.yaml not present")
def test_registry_md_lists_all_62_ids_with_the_papers_expected_values():
    spec = yaml.load(SHARED_SPEC.read_text(), Loader=LOADER)
    entries = sections((REPO / "REGISTRY.md").read_text())
    assert list(entries) == list(ALL_IDS)
    for result in spec["results"]:
        text = entries[result["id"]]
        paper = text.split("Expected (paper):", 1)[1]
        for item in result["expected"]:
            row = next(line for line in paper.splitlines() if line.startswith(f"| `{item['name']}` |"))
            assert row.split(" | ")[1] == fmt_value(item["value"]), (result["id"], item["name"])
        for heading in ("**Where:**", "**Data:**", "**Code:**", "**Config:**", "**Seeds:**", "**Compute:**",
                        "**Command:**", "**Status:**", "**Nondeterminism:**"):
            assert heading in text, (result["id"], heading)


def test_check_flag_detects_a_stale_file(scratch_root, monkeypatch, capsys):
    monkeypatch.chdir(scratch_root)
    assert main(["repro", "registry-md", "--check"]) == 1          # absent counts as stale
    assert main(["repro", "registry-md"]) == 0
    assert main(["repro", "registry-md", "--check"]) == 0
    path = scratch_root / "registry.yaml"
    path.write_text(path.read_text().replace("    claim: ", "    claim: being built; ", 1))
    assert main(["repro", "registry-md", "--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert "being built" in render_registry_md(load_registry(scratch_root))
