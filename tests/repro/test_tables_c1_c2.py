"""Tables 6 and 7 (R-C1: decision events, the margin audit) and Table 8 (R-C2: attribution fidelity), rendered
on fixture numbers files at the paper's values and on the committed demo numbers files."""

import json
import re

import pytest

from mistill.repro.render import MISSING, render_paper
from tests.repro.repro_helpers import REPO, md_cells, paper_values, templates_with, write_fixture

TABLES = {"table6": "R-C1", "table7": "R-C1", "table8": "R-C2"}
KINDS = {"P1 (chapter)": "p1", "P2 (character)": "p2", "P2C (contrastive)": "p2c", "NULL": "null"}
DETACHED, INTACT, IG = ("detached hook (attribution pass)", "intact graph (corrected hook)",
                        "integrated gradients (intact, 5 steps)")


def md_row(text, label):
    """The cells of the Markdown row labelled `label` (label first, without the table's pipes)."""
    line = next(line for line in text.splitlines() if line.startswith(f"| {label} |"))
    return md_cells(line)


def md_header(text):
    return md_row(text, text.split("\n| ", 1)[1].split(" |", 1)[0])


@pytest.fixture
def templates(tmp_path):
    """These three tables and the shared layout alone (no figures): each render takes a fraction of a second."""
    return templates_with(tmp_path / "templates", TABLES)


@pytest.fixture
def results(registry, tmp_path):
    d = tmp_path / "results"
    for rid in sorted(set(TABLES.values())):
        write_fixture(d, rid, paper_values(registry, rid))
    return d


def render(registry, results, out, templates, profile="paper"):
    report = render_paper(registry, results_dir=results, out_dir=out, templates_dir=templates, profile=profile)
    return report, {name: (out / "tables" / f"{name}.md").read_text() for name in TABLES}


def missing_keys(report, name):
    """The keys (list index stripped) a table showed ?? for."""
    return {re.sub(r"\[\d+\]$", "", label.split(".", 1)[1]) for label in report.missing.get(f"tables/{name}.md", [])}


def test_paper_values_fill_their_cells(registry, results, templates, tmp_path):
    report, t = render(registry, results, tmp_path / "build", templates)
    # Table 6: every event count, the P1 median margin and the P2C extraction counts of App. C
    t6 = t["table6"]
    assert md_header(t6) == ["Event kind", "all events", "notes with events", "faithfulness pass (notes)",
                             "median margin"]
    assert [md_row(t6, label)[1] for label in KINDS] == ["2064", "7688", "3855", "2000"]
    assert md_row(t6, "P1 (chapter)")[4] == "6.02"
    assert [md_row(t6, label)[3] for label in KINDS] == ["–"] * 4            # no key holds the faithfulness pass
    assert md_row(t6, "P2C events with earlier mentions of the code")[1:] == ["2208", "–", "–", "–"]
    assert md_row(t6, "P2C events uncapped (before the cap of 2 per pair)")[1] == "9474"
    assert md_row(t6, "first mentions that are siblings of an earlier mention, %")[1] == "30"
    assert "– : no registered value" in t6
    # Table 7: the paper's text gives only the median P1 margin
    t7 = t["table7"]
    assert md_row(t7, "P1 (chapter)")[2] == "6.02"
    assert md_row(t7, "P2 (character)")[2] == MISSING                        # a reader's key the paper never printed
    # Table 8: the self-test at the paper's top-20
    t8 = t["table8"]
    assert md_header(t8)[4:] == ["top-20 shared with exact", "top-20 effect recovered, %"]
    assert md_row(t8, DETACHED)[1:] == ["0.36", "0.47", MISSING, "–", "48"]
    assert md_row(t8, INTACT)[1:] == ["0.84", "0.85", "0.51", "16", "92"]
    assert md_row(t8, IG)[1:] == ["0.63", "–", "–", "–", "–"]
    noise = {"forward margin s.d. over identical forwards, nats": "0.046", "forward margin range, nats": "0.09",
             "single-head detection floor (3 s.d.), nats": "0.14", "heads above the floor per event, min": "71",
             "heads above the floor per event, max": "397",
             "all heads knocked in minus clean margin, median, nats": "0.00"}
    assert {label: md_row(t8, label)[1] for label in noise} == noise
    tex = (tmp_path / "build" / "tables" / "table8.tex").read_text()
    assert r"intact graph (corrected hook) & 0.84 & 0.85 & 0.51 & 16 & 92 \\" in tex
    assert r"\label{tab:attribution-fidelity}" in tex and "[R-C2]}" in tex
    # Every ?? is a key the paper's values do not hold (the readers' own keys); none of the paper's is missing.
    for name, rid in TABLES.items():
        paper_keys = set(registry.expected("paper").values[rid])
        assert missing_keys(report, name).isdisjoint(paper_keys), name
    assert missing_keys(report, "table8") == {"detached_spearman", "all_heads_knockin_minus_clean_max_abs"}


def _demo_value(rid, key):
    return json.loads((REPO / "results" / f"{rid}.json").read_text())["values"][key]["value"]


def _printed(value, digits=3):
    """A number as the renderer prints it: ints whole, floats to `digits` decimals, a Unicode minus in Markdown."""
    text = str(value) if isinstance(value, int) else f"{value:.{digits}f}"
    return text.replace("-", "−")


def test_demo_numbers_files_fill_every_cell_the_demo_claims(registry, templates, tmp_path):
    report, t = render(registry, REPO / "results", tmp_path / "build", templates, profile="demo")
    for name, rid in TABLES.items():
        demo_keys = set(registry.expected("demo").values[rid])
        assert missing_keys(report, name).isdisjoint(demo_keys), name
    # the demo's numbers files hold every key these tables read: no ?? at all
    assert not any(MISSING in text for text in t.values())
    t6, t7, t8 = t["table6"], t["table7"], t["table8"]
    assert md_row(t6, "P2C (contrastive)")[1] == _printed(_demo_value("R-C1", "p2c_event_count"))
    assert md_row(t6, "NULL")[2] == _printed(_demo_value("R-C1", "notes_with_null_events"))
    assert md_row(t7, "P2 (character)")[5] == _printed(_demo_value("R-C1", "share_p2_margin_below_5"))
    assert md_row(t7, "NULL")[4] == _printed(_demo_value("R-C1", "median_null_entropy"))
    assert md_row(t7, "P2 (character)")[1] == _printed(_demo_value("R-C1", "p10_p2_margin"), 2)   # margins: 2
    # Table 8's top-k is the demo's own (keys_like), not the paper's top-20
    k = next(m.group(1) for key in json.loads((REPO / "results" / "R-C2.json").read_text())["values"]
             if (m := re.fullmatch(r"intact_top(\d+)_effect_recovered", key)))
    assert k != "20" and md_header(t8)[4:] == [f"top-{k} shared with exact", f"top-{k} effect recovered, %"]
    assert md_row(t8, INTACT)[3] == _printed(_demo_value("R-C2", "intact_spearman"), 2)
    assert md_row(t8, INTACT)[5] == _printed(_demo_value("R-C2", f"intact_top{k}_effect_recovered"), 0)
    assert md_row(t8, IG)[1] == _printed(_demo_value("R-C2", "integrated_gradients_corr_intact"), 2)


@pytest.mark.parametrize("table, rid, key, new, label, column", [
    ("table6", "R-C1", "p2c_event_count", 3900, "P2C (contrastive)", 1),
    ("table6", "R-C1", "p2c_events_uncapped", 9475, "P2C events uncapped (before the cap of 2 per pair)", 1),
    ("table7", "R-C1", "median_p1_margin", 5.87, "P1 (chapter)", 2),
    ("table8", "R-C2", "attr_vs_exact_corr_detached_above_noise", 0.52, DETACHED, 2),
    ("table8", "R-C2", "intact_top20_overlap_with_exact", 17, INTACT, 4),
    ("table8", "R-C2", "heads_above_noise_floor_per_event", [71, 398], "heads above the floor per event, max", 1),
])
def test_changing_one_number_moves_its_cell(registry, results, templates, tmp_path, table, rid, key, new, label,
                                            column):
    _, before = render(registry, results, tmp_path / "before", templates)
    write_fixture(results, rid, paper_values(registry, rid, **{key: new}))
    _, after = render(registry, results, tmp_path / "after", templates)
    shown = str(new[-1] if isinstance(new, list) else new)
    assert md_row(after[table], label)[column] == shown != md_row(before[table], label)[column]
    # Only that cell moved: one line, and in it one cell.
    diff = [(a, b) for a, b in zip(before[table].splitlines(), after[table].splitlines()) if a != b]
    assert len(diff) == 1
    cells = [(a, b) for a, b in zip(*(line.split(" | ") for line in diff[0])) if a != b]
    assert len(cells) == 1
    # ...and in no other table reading the same result (the P1 median is in both Tables 6 and 7).
    others = [name for name in TABLES if name != table and before[name] != after[name]]
    assert others == (["table6"] if key == "median_p1_margin" else [])
