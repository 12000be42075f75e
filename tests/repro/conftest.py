"""Fixtures for the reproducibility spine: the real registry, and scratch copies of it under tmp_path."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mistill.repro.registry import Registry, load_registry
from tests.repro.repro_helpers import REPO, commit_all


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


@pytest.fixture
def git_root(scratch_root: Path) -> Path:
    """The scratch copy as a git work tree with everything committed: what `bless` needs (a clean tree)."""
    commit_all(scratch_root, init=True)
    return scratch_root
