"""params variants.evaluated, variants.own_heads and variants.edited: the recipe variants whose test generations
(EV-variant), own-heads chain (M6-variant) and trace edits (M6-variant-edits) some stage reads, and no others, so the
grid computes nothing no result reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mistill.params import load_all, load_params
from mistill.repro.families import pipeline_families
from tests.repro.repro_helpers import REPO


def _readers_of(subdir: str) -> dict[str, set[str]]:
    """Variant name -> the stages (and family items) that depend on its output under `<variants.dir>/<subdir>`,
    the family that writes those outputs left out."""
    from dvc.repo import Repo

    params = load_params(REPO / "params.yaml")
    variants = params["variants"]
    labels = {f"student-{e['student']}-{name}-{e['precision']}-s{e['seed']}": name
              for name, e in variants["arms"].items()}
    root = f"{variants['dir']}/{subdir}/"
    readers: dict[str, set[str]] = {}
    with Repo(str(REPO)) as repo:
        stages = list(repo.index.stages)
        families = pipeline_families(REPO, stages)
        deps = [(s.name, Path(os.path.relpath(d.fs_path, REPO)).as_posix()) for s in stages for d in s.deps
                if s.name not in families]
    deps += [(item.name, dep) for family in families.values() for item in family.items for dep in item.deps]
    for stage, dep in deps:
        if dep.startswith(root):
            label = dep[len(root):].split("/")[0]
            readers.setdefault(labels[label], set()).add(stage)
    return readers


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(("listing", "subdir"), [("evaluated", "DT-eval"), ("own_heads", "M6"), ("edited", "M6-edits")])
def test_each_listing_is_exactly_the_variants_whose_outputs_a_stage_reads(listing, subdir):
    variants = load_params(REPO / "params.yaml")["variants"]
    readers = _readers_of(subdir)
    assert set(variants[listing]) == set(readers), {
        "listed, never read": sorted(set(variants[listing]) - set(readers)),
        "read, not listed": sorted(set(readers) - set(variants[listing]))}
    for name in variants[listing]:
        assert variants[listing][name] == variants["arms"][name]      # the arm's own entry, not a copy that drifts


def test_every_profile_lists_the_same_variants():
    data = load_all(REPO / "params.yaml")
    profiles = [name for name, section in data.items() if name != "profile" and "variants" in section]
    assert len(profiles) >= 3
    for listing in ("arms", "evaluated", "own_heads", "edited"):
        assert len({tuple(sorted(data[p]["variants"][listing])) for p in profiles}) == 1, listing
