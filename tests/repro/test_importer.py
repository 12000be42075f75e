"""tools/import_paper_registry.py: the one-time import reproduces the committed paper values."""

import importlib.util

import pytest

from tests.repro.repro_helpers import REPO, SHARED_SPEC

spec = importlib.util.spec_from_file_location("import_paper_registry", REPO / "tools" / "import_paper_registry.py")
importer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(importer)


@pytest.mark.parametrize("name, value, stat, kind", [
    ("median_p1_margin", 6.02, "nats, median over P1 events", "nats"),
    ("p1_event_count", 2064, "count (100 traces)", "count"),
    ("first_mentions_that_are_siblings_of_earlier", 30, "percent of first mentions", "percent"),
    ("smollm_mistill_seed_diff_p", 0.93, "sign-test p", "p_value"),
    ("flip_layer", 24, "layer index (L24)", "discrete"),
    ("attr_vs_exact_corr_intact_graph", 0.84, "correlation over all 1,600 heads", "share"),
    ("median_locus_distance", 7, "tokens before the letter", "quantity"),
])
def test_kinds_hand_worked(name, value, stat, kind):
    assert importer.infer_kind(name, value, stat) == kind


@pytest.mark.skipif(not SHARED_SPEC.exists(), reason="../shared/spec/paper_registry.yaml not present")
def test_reimport_reproduces_committed_paper_values(tmp_path):
    assert importer.main([str(SHARED_SPEC), "--root", str(tmp_path)]) == 0
    assert (tmp_path / "results" / "expected" / "paper.yaml").read_text() == \
        (REPO / "results" / "expected" / "paper.yaml").read_text()
    # registry.yaml is the source of truth once imported: no silent overwrite.
    assert importer.main([str(SHARED_SPEC), "--root", str(tmp_path)]) == 2
