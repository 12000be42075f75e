"""Tables 10, 11, 13 and 14 (App. D; R-C3 and R-C4): every cell from a numbers file, each profile's own set
sizes and named heads.  Rendered from a templates folder holding only these tables and the shared layout, so
that no figure is drawn."""

import json
import re

import pytest

from mistill.params import load_params
from mistill.repro.render import MISSING, render_paper
from tests.repro.repro_helpers import REPO, md_table, paper_values, templates_with, write_fixture

TABLES = ("table10", "table11", "table13", "table14")
NEC = "Necessity (share of the clean margin destroyed by mean-ablation; >1: flipped)"
KIN = "Knock-in recovery in another patient's context"
NAMED = "Named heads: I_c in nats (rank)"


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    return templates_with(tmp_path_factory.mktemp("templates"), TABLES)


def render(registry, results, out, templates, profile="paper"):
    return render_paper(registry, results_dir=results, out_dir=out, templates_dir=templates, profile=profile)


def paper_fixture(registry, results, **overrides):
    """R-C3 and R-C4 at the paper's expected values; overrides as {id: {key: value}}."""
    for rid in ("R-C3", "R-C4"):
        write_fixture(results, rid, paper_values(registry, rid, **overrides.get(rid, {})))
    return results


def md_rows(text):
    """{(section, label): [cells]} of a rendered Markdown table (section None before the first)."""
    return {(section, label): cells for section, rows in md_table(text).items() for label, cells in rows.items()}


def md_row(text, label, section=None):
    return md_rows(text)[(section, label)]


def fmt3(x):
    """A value as the renderer prints a key the paper never printed (3 decimals, a true minus sign)."""
    text = str(x) if isinstance(x, int) else f"{x:.3f}"
    return text.replace("-", "−")


@pytest.fixture(scope="module")
def paper_tables(registry, templates, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("paper")
    report = render(registry, paper_fixture(registry, tmp / "results"), tmp / "build", templates)
    return report, {t: (tmp / "build" / "tables" / f"{t}.md").read_text() for t in TABLES}


@pytest.fixture(scope="module")
def demo_tables(registry, templates, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("demo")
    report = render(registry, REPO / "results", tmp / "build", templates, profile="demo")
    return report, {t: (tmp / "build" / "tables" / f"{t}.md").read_text() for t in TABLES}


def demo_values(rid):
    return {k: v["value"] for k, v in json.loads((REPO / "results" / f"{rid}.json").read_text())["values"].items()}


# --- the paper's profile, at the paper's printed values ---------------------------------------------------------

def test_paper_every_cell_from_the_numbers_files(paper_tables):
    report, tables = paper_tables
    for name, text in tables.items():
        assert MISSING not in text, name
    assert not any(k.startswith("tables/") for k in report.missing)


def test_paper_table10_every_k(paper_tables):
    t10 = paper_tables[1]["table10"]
    rows = md_rows(t10)
    assert md_row(t10, "top-8", NEC) == ["0.62", "0.78", "0.63"]
    assert md_row(t10, "bottom-8", NEC) == ["−0.36", "–", "–"]
    assert md_row(t10, "bottom-100", NEC) == ["1.57", "–", "–"]
    # the paper gives the P1/P2 necessity count only as a range over the two phases
    assert md_row(t10, "notes: top-8 beats random", NEC) == ["92 / 100", "", "90"]
    assert md_row(t10, "top-3", KIN) == ["0.16", "–", "0.05"]
    assert md_row(t10, "notes: top-3 beats random", KIN) == ["–", "–", "80"]
    assert md_row(t10, "top-8", KIN) == ["0.67", "0.48", "0.69"]
    assert md_row(t10, "top-40", KIN) == ["0.86", "0.79", "0.85"]
    assert md_row(t10, "random-40", KIN) == ["0.04", "0.02", "0.02"]
    assert md_row(t10, "notes: top-40 beats random", KIN) == ["100", "100", "92"]
    assert md_row(t10, "top-100", KIN) == ["0.96", "–", "–"]
    assert md_row(t10, "knock-in of the bottom-k (range over k)", "Over every k") == ["−0.81 / −0.16", "", ""]
    assert md_row(t10, "knock-in of random sets, at most (over phases and small k)", "Over every k")[0] == "0.09"
    # rows no registered paper value fills are left out, not shown as a line of dashes
    assert (NEC, "random-8") not in rows and (KIN, "bottom-40") not in rows and (NEC, "top-40") not in rows
    knockin_ks = [label for (section, label) in rows if section == KIN and label.startswith("top-")]
    assert knockin_ks == ["top-3", "top-8", "top-40", "top-100"]


def test_paper_table11_named_heads_and_layers(paper_tables):
    t11 = paper_tables[1]["table11"]
    assert md_row(t11, "L39H38", NAMED) == ["0.91", "0.97", "0.62"]
    assert md_row(t11, "L30H11", NAMED) == ["– (1500)", "–", "– (2)"]
    counts = "Over all heads (counts)"
    assert md_row(t11, "heads with I_c > 0 (BH, FDR 0.05)", counts) == ["429", "543", "340"]
    assert md_row(t11, "heads with I_c < 0 (BH, FDR 0.05)", counts) == ["546", "–", "–"]
    layers = "Layers of the chapter set"
    assert [md_row(t11, f"chapter top-40: heads in layers {r}", layers)[0]
            for r in ("0–11", "12–23", "24–31", "32–39")] == ["0", "2", "24", "14"]
    assert md_row(t11, "chapter top-40: percent of its I_c in layers 24–31", layers) == ["53", "", ""]
    assert "each phase's rank-1 head" not in t11     # the paper registers no leader-generic value


def test_paper_table13_exact_refinement(paper_tables):
    t13 = paper_tables[1]["table13"]
    assert md_row(t13, "heads nominated for exact mean-ablation") == ["56"]
    assert md_row(t13, "exact-merged and first-order top-40: heads shared") == ["33"]
    assert md_row(t13, "heads with exact-merged I > 0 (BH, FDR 0.05)") == ["313"]
    assert md_row(t13, "first-order against exact I: median per-event Pearson") == ["0.72"]


def test_paper_table14_global_against_own(paper_tables):
    t14 = paper_tables[1]["table14"]
    assert md_row(t14, "top-8", NEC) == ["0.62", "0.63", "0.78", "1.10", "0.63", "–"]
    assert md_row(t14, "top-8", KIN) == ["0.67", "0.45", "0.48", "0.59", "0.69", "–"]
    assert md_row(t14, "top-40", KIN) == ["0.86", "–", "0.79", "–", "0.85", "–"]
    assert "At the top-40 operating point the global set's knock-in is within 0.04 of the note's own" in t14


# --- the demo profile, on the committed numbers files ------------------------------------------------------------

def test_demo_rows_are_the_demos_own(registry, demo_tables):
    report, tables = demo_tables
    assert not any(k.startswith(tuple(f"tables/{t}." for t in TABLES)) for k in report.missing)
    for name, text in tables.items():
        assert MISSING not in text, name
    expected = registry.expected("demo").values
    ks = sorted({int(m.group(1)) for key in expected["R-C3"]
                 if (m := re.fullmatch(r"knockin_top([0-9]+)_p1", key))})
    assert ks == [3, 8, 16, 24]
    for name in ("table10", "table14"):
        rows = md_rows(tables[name])
        for section in (NEC, KIN):
            assert [label for (s, label) in rows if s == section and label.startswith("top-")] == \
                [f"top-{k}" for k in ks], (name, section)
    assert "top-40" not in tables["table10"] and "top-40" not in tables["table14"]
    heads = list(dict.fromkeys(m.group(1) for key in expected["R-C4"]
                               if (m := re.fullmatch(r"(l[0-9]+h[0-9]+)_(?:ic|rank)_p[12]c?", key))))
    named = load_params(REPO / "params.yaml", profile="demo")["readers"]["named_heads"]
    assert heads == [named["leader"], named["contrastive_specialist"]]
    assert [label for (s, label) in md_rows(tables["table11"]) if s == NAMED] == \
        [h.upper() for h in heads] + ["each phase's rank-1 head"]
    assert "L39H38" not in tables["table11"]


def test_demo_cells_equal_the_numbers_files(demo_tables):
    tables = demo_tables[1]
    c3, c4 = demo_values("R-C3"), demo_values("R-C4")
    t10, t11, t13, t14 = (tables[t] for t in TABLES)
    assert md_row(t10, "top-16", NEC) == [fmt3(c3[f"necessity_top16_{p}"]) for p in ("p1", "p2", "p2c")]
    assert md_row(t10, "random-24", KIN) == [fmt3(c3[f"knockin_random24_{p}"]) for p in ("p1", "p2", "p2c")]
    assert md_row(t10, "notes: top-16 beats random", KIN) == \
        [str(c3[f"notes_knockin_above_random_{p}_k16"]) for p in ("p1", "p2", "p2c")]
    assert md_row(t14, "top-24", KIN) == [fmt3(c3[f"{s}knockin_top24_{p}"]) for p in ("p1", "p2", "p2c")
                                         for s in ("", "own_ranking_")]
    named = load_params(REPO / "params.yaml", profile="demo")["readers"]["named_heads"]
    leader, specialist = named["leader"], named["contrastive_specialist"]
    assert md_row(t11, leader.upper(), NAMED) == [fmt3(c4[f"{leader}_ic_{p}"]) for p in ("p1", "p2", "p2c")]
    assert md_row(t11, specialist.upper(), NAMED) == \
        [f"– ({c4[f'{specialist}_rank_p1']})", "–", f"– ({c4[f'{specialist}_rank_p2c']})"]
    assert md_row(t11, "each phase's rank-1 head", NAMED) == [fmt3(c4[f"top_head_ic_{p}"]) for p in ("p1", "p2", "p2c")]
    assert md_row(t11, "heads with I_c < 0 (BH, FDR 0.05)", "Over all heads (counts)") == \
        [str(x) for x in c4["bh_heads_ic_negative_p1_p2_p2c"]]
    assert md_row(t11, "chapter top-8: heads in layers 0–1", "Layers of the chapter set")[0] == \
        str(c4["chapter_top8_heads_in_layers_0_1"])
    assert md_row(t13, "exact-merged and first-order top-8: heads shared") == \
        [str(c4["exact_merged_vs_firstorder_top8_overlap"])]
    assert md_row(t13, "heads nominated for exact mean-ablation") == [f"{c4['exact_refinement_nominated_heads']:.1f}"]


# --- one number moves one cell -----------------------------------------------------------------------------------

@pytest.mark.parametrize("table, rid, key, new, section, label, column", [
    ("table10", "R-C3", "knockin_top40_p2", 0.71, KIN, "top-40", 1),
    ("table10", "R-C3", "necessity_bottom40_p1", 0.93, NEC, "bottom-40", 0),
    ("table11", "R-C4", "l39h38_ic_p2c", 0.55, NAMED, "L39H38", 2),
    ("table11", "R-C4", "l30h11_rank_p1", 1490, NAMED, "L30H11", 0),
    ("table13", "R-C4", "exact_merged_bh_positive_heads", 300, None, "heads with exact-merged I > 0 (BH, FDR 0.05)", 0),
    ("table14", "R-C3", "own_ranking_necessity_top8_p2", 1.23, NEC, "top-8", 3),
])
def test_changing_one_number_moves_its_cell(registry, templates, paper_tables, tmp_path, table, rid, key, new,
                                            section, label, column):
    before = paper_tables[1][table]
    paper_fixture(registry, tmp_path / "results", **{rid: {key: new}})
    render(registry, tmp_path / "results", tmp_path / "after", templates)
    after = (tmp_path / "after" / "tables" / f"{table}.md").read_text()
    printed = f"– ({new})" if key.endswith(("_rank_p1", "_rank_p2c")) else f"{new}"
    assert md_row(after, label, section)[column] == printed
    assert md_row(before, label, section)[column] != printed
    diff = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
    assert len(diff) == 1 and len(before.splitlines()) == len(after.splitlines())
    others = [i for i, (a, b) in enumerate(zip(md_row(before, label, section), md_row(after, label, section)))
              if a != b]
    assert others == [column]
    assert f"{new}" in (tmp_path / "after" / "tables" / f"{table}.tex").read_text()
