"""Figures: drawn from numbers files only (PDF and PNG), gaps shown and counted, placeholders for the rest."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

pytest.importorskip("matplotlib")

from mistill.errors import UserError  # noqa: E402
from mistill.repro import figures as figures_module  # noqa: E402
from mistill.repro.render import render_paper  # noqa: E402
from tests.repro.repro_helpers import REPO, paper_values, write_fixture  # noqa: E402

TEMPLATES = REPO / "paper" / "templates"
SPECS = sorted(p.stem for p in (TEMPLATES / "figures").glob("*.yaml"))


@pytest.fixture
def results(tmp_path):
    """A copy of the committed demo numbers files."""
    d = tmp_path / "results"
    d.mkdir()
    for path in (REPO / "results").glob("R-*.json"):
        shutil.copy(path, d / path.name)
    return d


def render(registry, results, out, templates=TEMPLATES, profile="demo"):
    return render_paper(registry, results_dir=results, out_dir=out, templates_dir=templates, profile=profile)


def test_every_figure_renders_from_the_committed_results(registry, results, tmp_path):
    report = render(registry, results, tmp_path / "build")
    figs = {f.name: f for f in report.figures.figures}
    assert sorted(figs) == SPECS
    for name in SPECS:
        for fmt in ("pdf", "png"):
            data = (tmp_path / "build" / "figures" / f"{name}.{fmt}").read_bytes()
            assert data.startswith(b"%PDF" if fmt == "pdf" else b"\x89PNG"), (name, fmt)
    # the demo's numbers files feed these; the paper's Figures 1, 3, 4, 5, 7 and 8 read results the demo
    # does not produce, and are missing-data placeholders
    for name in ("repro-knockin-by-k", "repro-own-heads", "repro-margins", "repro-task-by-arm"):
        assert not figs[name].placeholder and figs[name].drawn > 0, name
    assert not figs["repro-own-heads"].missing and figs["repro-own-heads"].drawn == 15
    assert sorted(f.name for f in report.figures.placeholders) == [f"figure{i}" for i in (1, 3, 4, 5, 7, 8)]
    assert "R-C6" in figs["figure1"].placeholder
    # Figure 2 is partial: R-D6's bars drawn, the controls' (R-D7, R-D13, R-D14) shown as ?? and counted
    assert figs["figure2"].drawn == 4 and "R-D7.qwen_randpos_own_p2c" in figs["figure2"].missing
    assert report.missing["figures/figure2"] == figs["figure2"].missing
    assert "R-D7.qwen_randpos_own_p2c" in report.shown_missing()
    assert report.figures.summary() == ("figures: 12 rendered, 6 from numbers files (3 with ?? points), "
                                        "6 missing-data placeholder(s)")
    index = (tmp_path / "build" / "figures" / "index.md").read_text()
    assert "![repro-knockin-by-k](repro-knockin-by-k.png)" in index and "missing-data placeholder" in index


def test_a_figure_changes_when_its_input_number_changes_and_only_then(registry, results, tmp_path):
    render(registry, results, tmp_path / "a")
    figures_module._DRAWN.clear()                 # draw afresh: the same numbers give the same bytes
    render(registry, results, tmp_path / "b")
    path = results / "R-C3.json"
    numbers = json.loads(path.read_text())
    numbers["values"]["knockin_top8_p1"]["value"] = 0.25
    path.write_text(json.dumps(numbers))
    render(registry, results, tmp_path / "c")
    for name in SPECS:
        for fmt in ("pdf", "png"):
            a, b, c = ((tmp_path / run / "figures" / f"{name}.{fmt}").read_bytes() for run in "abc")
            assert a == b, (name, fmt)
            assert (a != c) == (name == "repro-knockin-by-k"), (name, fmt)


def test_a_paper_result_turns_a_placeholder_into_a_figure(registry, tmp_path):
    results = tmp_path / "results"
    write_fixture(results, "R-C6", paper_values(registry, "R-C6"))
    report = render(registry, results, tmp_path / "build", profile="paper")
    fig1 = next(f for f in report.figures.figures if f.name == "figure1")
    assert not fig1.placeholder and fig1.drawn == 11 and fig1.missing == []


def _templates_with(tmp_path, name, spec):
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES, templates)
    (templates / "figures" / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    return templates


@pytest.mark.parametrize("spec, message", [
    ({"title": "x", "reads": ["R-C3"], "panels": [{"kind": "bars", "bars": [{"label": "a", "value": "R-C1.p1_event_count"}]}]},
     "reads R-C1 without declaring it"),
    ({"title": "x", "reads": ["R-C1"], "panels": [{"kind": "bars", "bars": [{"label": "a", "value": "R-C1.no_such_key"}]}]},
     "R-C1 has no registered value key 'no_such_key'"),
    ({"title": "x", "reads": ["R-C1"], "panels": [{"kind": "bars", "bars": [{"label": "a", "value": 0.5}]}]},
     "0.5 is not a number reference"),
    ({"title": "x", "reads": ["R-C1"], "panels": [{"kind": "pie"}]}, "kind must be one of bars, lines"),
    ({"title": "x", "reads": []}, "reads at least one result id"),
    ({"title": "x", "reads": ["R-C1"], "panels": [{"kind": "bars", "bars": [{"label": None, "value": "R-C1.p1_event_count"}]}]},
     "needs a label"),
])
def test_bad_figure_specs_are_one_line_errors(registry, results, tmp_path, spec, message):
    templates = _templates_with(tmp_path, "bad", spec)
    with pytest.raises(UserError, match=message):
        render(registry, results, tmp_path / "build", templates=templates)
    assert not (tmp_path / "build").exists()
