"""Figures: drawn from numbers files only (PDF and PNG), gaps shown and counted, placeholders for the rest."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

pytest.importorskip("matplotlib")

from mistill.errors import UserError  # noqa: E402
from mistill.repro import figures as figures_module  # noqa: E402
from mistill.repro.numbers import read_numbers  # noqa: E402
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
    # the demo's numbers files feed these; the paper's Figure 3 is a worked example with no numbers, a
    # missing-data placeholder
    for name in ("repro-knockin-by-k", "repro-own-heads", "repro-margins", "repro-task-by-arm", "figure4", "figure1"):
        assert not figs[name].placeholder and figs[name].drawn > 0, name
    assert not figs["repro-own-heads"].missing and figs["repro-own-heads"].drawn == 19
    assert [f.name for f in report.figures.placeholders] == ["figure3"]
    assert not figs["figure8"].placeholder and not figs["figure8"].missing   # R-D8's curve at the demo's sizes
    assert not figs["figure7"].placeholder and not figs["figure7"].missing   # R-D31's seed pairs and medians
    # Figure 5 draws the residual swap over the demo's 4-layer grid (two by-layer panels: 4 ticks each, 3 and 2
    # series of 4 points) and its registered points (3 bars, 4 ratios)
    assert figs["figure5"].drawn == (4 + 3 * 4) + (4 + 2 * 4) + 3 + 4 and not figs["figure5"].missing
    # Figure 1 from R-C6 at the demo's set sizes (its own keys, the second reference of each ablation bar)
    assert figs["figure1"].drawn == 11 and not figs["figure1"].missing
    # Figure 2 whole: the main arms from R-D6 (untrained, bf16 Vanilla and Mistill per student), the teacher and
    # floor lines, and every control of R-D7, R-D13 and R-D14 (14 + 1 and 8 + 1 marks)
    assert figs["figure2"].drawn == 24 and not figs["figure2"].missing
    # without R-D7 its bars are shown as ?? and counted; the SmolLM3 Mistill bar falls back to R-D6's seed-0 cell
    (results / "R-D7.json").unlink()
    partial = {f.name: f for f in render(registry, results, tmp_path / "partial").figures.figures}["figure2"]
    assert partial.drawn == 24 - 5 and "R-D7.qwen_randpos_own_p2c" in partial.missing
    assert not any(m.startswith(("R-D6.", "R-D7.smollm_mistill_s0")) for m in partial.missing)
    assert report.figures.summary() == ("figures: 12 rendered, 11 from numbers files (1 with ?? points), "
                                        "1 missing-data placeholder(s)")
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


def test_a_list_of_references_draws_the_first_a_numbers_file_holds(registry, results, tmp_path):
    """A bar that two results can hold (the paper's seed grid, the cell a one-seed profile computes) draws the
    first one present; a gap is reported for each reference only when none is."""
    held = json.loads((results / "R-C1.json").read_text())["values"]["p1_event_count"]["value"]
    spec = {"title": "first of", "reads": ["R-C1", "R-D37"], "panels": [{"kind": "bars", "bars": [
        {"label": "grid, else own", "value": ["R-D37.mq_mistill_minus_vanilla_recovery", "R-C1.p1_event_count"]},
        {"label": "neither", "value": ["R-D37.mq_mistill_minus_vanilla_recovery",
                                       "R-D37.mq_mistill_minus_randheads_recovery"]}]}]}
    templates = _templates_with(tmp_path, "zz-first", spec)
    report = render(registry, results, tmp_path / "build", templates=templates)
    fig = next(f for f in report.figures.figures if f.name == "zz-first")
    assert fig.drawn == 1 and held > 0
    assert fig.missing == ["R-D37.mq_mistill_minus_randheads_recovery", "R-D37.mq_mistill_minus_vanilla_recovery"]
    with pytest.raises(UserError, match="an empty list of number references"):
        render(registry, results, tmp_path / "again",
               templates=_templates_with(tmp_path / "e", "zz-empty", {**spec, "panels": [
                   {"kind": "bars", "bars": [{"label": "none", "value": []}]}]}))


def test_a_lines_panel_over_a_list_value_draws_every_grid_point(registry, results, tmp_path):
    """x_list: ticks from a list value whose length the profile decides (the swap's layer grid), each series a
    list value of the same length; a series no numbers file holds is a gap at every tick."""
    numbers = json.loads((results / "R-C12.json").read_text())
    grid = numbers["values"]["swap_layer_grid"]["value"]
    forced = numbers["values"]["tail_swap_forced_drop_by_layer"]["value"]
    panel = {"kind": "lines", "x_list": "R-C12.swap_layer_grid", "x_prefix": "L",
             "series": [{"label": "forced", "list": "R-C12.tail_swap_forced_drop_by_layer"}]}
    spec = {"title": "by layer", "reads": ["R-C12"], "panels": [panel]}
    lookup = figures_module._Lookup(registry, {"R-C12": read_numbers(results / "R-C12.json", registry)}, ["R-C12"],
                                    "spec", frozenset())
    data = figures_module._panel_data(lookup, panel, tmp_path / "spec.yaml", 0)
    assert data.labels == [f"L{layer}" for layer in grid] and data.series == [("forced", forced)]
    assert lookup.drawn == 2 * len(grid) and not lookup.missing
    report = render(registry, results, tmp_path / "build", templates=_templates_with(tmp_path, "zz-grid", spec))
    assert next(f for f in report.figures.figures if f.name == "zz-grid").drawn == 2 * len(grid)
    # a series one element short of the grid is a one-line error; a missing series a gap at every tick
    numbers["values"]["tail_swap_forced_drop_by_layer"]["value"] = forced[:-1]
    (results / "R-C12.json").write_text(json.dumps(numbers))
    with pytest.raises(UserError, match=f"has {len(grid) - 1} values for {len(grid)} ticks"):
        render(registry, results, tmp_path / "again", templates=_templates_with(tmp_path / "t2", "zz-grid", spec))
    del numbers["values"]["tail_swap_forced_drop_by_layer"]
    (results / "R-C12.json").write_text(json.dumps(numbers))
    report = render(registry, results, tmp_path / "third", templates=_templates_with(tmp_path / "t3", "zz-grid", spec))
    fig = next(f for f in report.figures.figures if f.name == "zz-grid")
    assert fig.missing == ["R-C12.tail_swap_forced_drop_by_layer"] and fig.drawn == len(grid)


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


# ---- named heads: {region_reader} and the like are the profile's heads (params readers.named_heads) ----------


def test_head_roles_follow_params_named_heads():
    from mistill.repro.labels import head_roles

    roles = head_roles({"leader": "l39h38", "region_readers": ["l26h36", "l28h21"], "contrastive_readers": ["l30h11"],
                        "recurrent": ["l39h38", "l39h13"]})
    assert roles == {"leader": "l39h38", "region_reader": "l26h36", "region_reader_2": "l28h21",
                     "contrastive_reader": "l30h11", "recurrent": "l39h38", "recurrent_2": "l39h13"}


def test_a_head_role_substitutes_in_a_label_and_a_number_reference():
    spec = {"title": "{teacher}: {region_reader}", "reads": ["R-C5"], "caption": "{prose_reader|upper} reads prose",
            "panels": [{"kind": "bars", "title": "{contrastive_reader_2}", "bars": [
                {"label": "{region_reader|upper}", "value": "R-C5.{region_reader}_region_share"},
                {"label": "{contrastive_reader|upper}: near-miss",
                 "value": "R-C5.{contrastive_reader}_near_miss_share",
                 "lo": "R-C5.{contrastive_reader}_near_miss_share_p10_p90[0]"}]},
                {"kind": "lines", "series": [{"label": "{region_reader}", "value": "R-C3.knockin_top{k}_p1"}]}]}
    names = {"teacher": "Qwen3-14B", "region_reader": "l26h36", "prose_reader": "l39h38",
             "contrastive_reader": "l30h11", "contrastive_reader_2": "l38h39"}
    named, refs = figures_module._roles_named(spec, names, "spec.yaml")
    assert named["title"] == "Qwen3-14B: l26h36" and named["caption"] == "L39H38 reads prose"
    bars = named["panels"][0]["bars"]
    assert named["panels"][0]["title"] == "l38h39"
    assert bars[0] == {"label": "L26H36", "value": "R-C5.l26h36_region_share"}
    assert bars[1] == {"label": "L30H11: near-miss", "value": "R-C5.l30h11_near_miss_share",
                       "lo": "R-C5.l30h11_near_miss_share_p10_p90[0]"}
    # {k} is a series' set size, not a role
    assert named["panels"][1]["series"] == [{"label": "l26h36", "value": "R-C3.knockin_top{k}_p1"}]
    assert spec["panels"][0]["bars"][0]["value"] == "R-C5.{region_reader}_region_share"   # the spec is not changed
    assert refs == {"R-C5.l26h36_region_share", "R-C5.l30h11_near_miss_share", "R-C5.l30h11_near_miss_share_p10_p90[0]"}


@pytest.mark.parametrize("profile, key, drawn", [
    ("demo", "l1h0_region_share", True),
    ("paper", "l26h36_region_share", False),
    # the rehearsal's stand-in head: a key no profile's expected values register is a gap, not an error
    ("rehearsal", "l2h0_region_share", False)])
def test_a_head_role_names_the_profiles_own_head(registry, results, tmp_path, profile, key, drawn):
    spec = {"title": "x", "reads": ["R-C5"], "panels": [{"kind": "bars", "bars": [
        {"label": "{region_reader|upper}", "value": "R-C5.{region_reader}_region_share"},
        {"label": "random panel", "value": "R-C5.random_panel_region_share"}]}]}
    templates = _templates_with(tmp_path, "heads", spec)
    if profile != "demo":
        results = tmp_path / "no-results"          # the profile's numbers are not here: its head's number is ??
        results.mkdir()
    report = render(registry, results, tmp_path / "build", templates=templates, profile=profile)
    fig = next(f for f in report.figures.figures if f.name == "heads")
    assert (f"R-C5.{key}" in fig.missing) is not drawn
    if drawn:
        assert fig.drawn == 2 and fig.missing == []


def test_an_unknown_head_role_is_a_one_line_error(registry, results, tmp_path):
    spec = {"title": "x", "reads": ["R-C5"], "panels": [{"kind": "bars", "bars": [
        {"label": "a", "value": "R-C5.{region_reader_9}_region_share"}]}]}
    templates = _templates_with(tmp_path, "bad", spec)
    with pytest.raises(UserError) as err:
        render(registry, results, tmp_path / "build", templates=templates)
    message = str(err.value)
    assert "bad.yaml: params labels.models or readers.named_heads names no 'region_reader_9'" in message
    assert "region_reader_2" in message and "\n" not in message
    assert not (tmp_path / "build").exists()


def test_figure4_draws_the_demos_named_heads_with_no_missing_number(registry, results, tmp_path):
    report = render(registry, results, tmp_path / "build")
    fig4 = next(f for f in report.figures.figures if f.name == "figure4")
    assert not fig4.placeholder and fig4.missing == [] and fig4.drawn == 11
    assert "figures/figure4" not in report.missing
