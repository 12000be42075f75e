"""Fixtures for the reproducibility spine: the real registry, and scratch copies of it under tmp_path."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mistill.repro.registry import Registry, load_registry

REPO = Path(__file__).resolve().parents[2]
SHARED_SPEC = REPO.parent / "shared" / "spec" / "paper_registry.yaml"


@pytest.fixture(scope="session")
def registry() -> Registry:
    return load_registry(REPO)


@pytest.fixture
def scratch_root(tmp_path: Path) -> Path:
    """A copy of the registry and the paper's expected values (no demo goldens) to modify freely."""
    root = tmp_path / "repo"
    (root / "results" / "expected").mkdir(parents=True)
    shutil.copy(REPO / "registry.yaml", root / "registry.yaml")
    shutil.copy(REPO / "results" / "expected" / "paper.yaml", root / "results" / "expected" / "paper.yaml")
    return root


def paper_values(registry: Registry, result_id: str, **overrides) -> dict:
    """A full set of values for one result equal to the paper's expected values, some overridden."""
    values = {}
    for key, exp in registry.expected("paper").values[result_id].items():
        value = overrides.pop(key, exp.value)
        values[key] = {"value": value, "statistic": exp.stat, "artifact": "fixture"}
    assert not overrides, f"unknown keys {overrides}"
    return values


def write_fixture(results_dir: Path, result_id: str, values: dict, profile: str = "paper") -> Path:
    """A numbers file written by hand (as a reader would through write_numbers)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{result_id}.json"
    path.write_text(json.dumps({"id": result_id, "profile": profile, "reader": "fixture", "inputs": {},
                                "values": values, "code_version": "test", "params_sha256": "0" * 64}))
    return path
