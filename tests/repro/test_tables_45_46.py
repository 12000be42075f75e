"""Tables 45 and 46 (App. L.1) on fixture numbers files: per-seed own-heads rows with the seed-matched comparisons,
and per-seed task rows with generation behaviour.

The templates are rendered alone (with the shared layout, no figures), under the paper's profile (three seeds) and
the demo's (one seed).
"""

import json

import pytest

from mistill.repro.labels import model_name, model_names
from mistill.repro.render import MISSING, render_paper
from tests.repro.repro_helpers import (
    REPO,
    md_cells,
    md_table,
    minus_sign,
    paper_values,
    templates_with,
    write_fixture,
)

TABLES = ("table45", "table46")
T45 = ["Arm", "M4 P1", "M4 P2", "M4 P2C", "M2 lift", "prefix", "task"]
T46 = ["Arm", "micro-F1", "valid", "cap", "tokens"]

# R-D6's per-seed cells of every arm row: a distinct number for every row, cell and seed, so a cell shows which key fed it
R_D6_ROWS = ("qwen_untrained", "qwen_vanilla_fp32", "qwen_vanilla_bf16", "qwen_mistill",
             "smollm_untrained", "smollm_vanilla_fp32", "smollm_vanilla_bf16", "smollm_mistill")
R_D6_CELLS = ("own_p1", "own_p2", "own_p2c", "m2_lift_p2c", "prefix_share_p2c")


def r_d6_seeds(row, cell, seeds=3):
    """The fixture's per-seed medians of one R-D6 cell: 0.3 + 0.05 row + 0.01 cell + 0.001 seed."""
    i, j = R_D6_ROWS.index(row), R_D6_CELLS.index(cell)
    return [round(0.3 + 0.05 * i + 0.01 * j + 0.001 * s, 3) for s in range(seeds)]


def r_d6_row_cells(seeds):
    cells = {f"{row}_{cell}_seeds": r_d6_seeds(row, cell, seeds) for row in R_D6_ROWS for cell in R_D6_CELLS}
    cells.update({"teacher_hd002_p1_k40": 0.92, "teacher_hd002_p2_k40": 0.82})
    return values_of(cells, "per-seed medians")


def values_of(numbers, statistic):
    return {k: {"value": x, "statistic": statistic, "artifact": "fixture"} for k, x in numbers.items()}


# The reader's own keys the paper's text prints no number for
R_D2_EXTRA = {"qwen_vanilla_fp32_microf1_seeds": [0.193, 0.183, 0.185], "qwen_vanilla_fp32_valid_rate": 0.83}
# Table 46's generation behaviour of the arms this repository trains (the paper's text prints none of it)
BEHAVIOUR = {"R-D1": ("qwen3_4b_untrained", "smollm3_3b_untrained"), "R-D2": ("qwen_vanilla_fp32", "smollm_vanilla_fp32"),
             "R-D3": ("qwen_featurekd", "smollm_featurekd"), "R-D4": ("distillm2", "opd", "gold"),
             "R-D5": ("qwen_mistill", "qwen_vanilla_bf16", "smollm_mistill", "smollm_vanilla_bf16")}


def behaviour(rid, valid=None):
    """Cap share 0.01 * (i + 1) and 400 + i generated tokens for the i-th row of `rid`; R-D5's bf16 valid rates."""
    out = {}
    for i, row in enumerate(BEHAVIOUR[rid]):
        out[f"{row}_cap_share"], out[f"{row}_mean_new_tokens"] = 0.01 * (i + 1), 400.0 + i
    if rid == "R-D5":
        out.update({f"{family}_vanilla_bf16_valid_rate": valid or 0.9 for family in ("qwen", "smollm")})
    if rid in ("R-D3", "R-D4"):   # the baseline rows' valid rates the paper prints none of
        out.update({"qwen_featurekd_valid_rate": valid or 0.93} if rid == "R-D3" else {"distillm2_valid_rate": valid or 0.95})
    return values_of(out, "mean over seeds")
R_D5_EXTRA = {"qwen_mistill_valid_rate": 0.85, "qwen_mistill_microf1_seeds": [0.151, 0.148, 0.149],
              "smollm_mistill_microf1_seeds": [0.06, 0.058, 0.061],
              "smollm_vanilla_bf16_microf1_seeds": [0.055, 0.05, 0.052]}
R_D6_EXTRA = {"smollm_mistill_minus_bf16_vanilla_p2": -0.041, "smollm_mistill_minus_fp32_vanilla_p2": -0.032}
R_D18_EXTRA = {
    "qwen_per_note_microf1_mistill_minus_bf16_vanilla": -0.006,
    "qwen_per_note_microf1_mistill_minus_bf16_vanilla_interval": [-0.021, 0.008],
    "qwen_per_note_microf1_mistill_minus_fp32_vanilla": -0.037,
    "qwen_per_note_microf1_mistill_minus_fp32_vanilla_interval": [-0.052, -0.022],
    "smollm_per_note_microf1_mistill_minus_bf16_vanilla": 0.004,
    "smollm_per_note_microf1_mistill_minus_bf16_vanilla_interval": [-0.011, 0.019],
    "smollm_per_note_microf1_mistill_minus_fp32_vanilla": -0.08,
    "smollm_per_note_microf1_mistill_minus_fp32_vanilla_interval": [-0.101, -0.059],
    "qwen_note_clustered_p2c_higher_notes": 107, "qwen_note_clustered_p2c_sign_p": 2e-07,
    "smollm_note_clustered_p2c_higher_notes": 130, "smollm_note_clustered_p2c_sign_p": 6e-21,
}


@pytest.fixture
def templates(tmp_path):
    """The two templates and the shared layout alone (no other table, no figure)."""
    return templates_with(tmp_path / "templates", TABLES)


@pytest.fixture
def paper_results(registry, tmp_path):
    """Every result the two tables read, at the paper's values, with three seeds wherever a cell is per seed."""
    d = tmp_path / "results"
    for rid in ("R-D12", "R-D15", "R-D17", "R-D30"):
        write_fixture(d, rid, paper_values(registry, rid))
    write_fixture(d, "R-D3", {**paper_values(registry, "R-D3"), **behaviour("R-D3"),
                              **values_of({"qwen_featurekd_microf1_seeds": [0.16, 0.141, 0.158]}, "micro-F1")})
    write_fixture(d, "R-D4", {**paper_values(registry, "R-D4"), **behaviour("R-D4")})
    write_fixture(d, "R-D1", {**paper_values(registry, "R-D1"), **behaviour("R-D1")})
    write_fixture(d, "R-D2", {**paper_values(registry, "R-D2", smollm_vanilla_fp32_microf1_seeds=[0.148, 0.113, 0.129]),
                              **values_of(R_D2_EXTRA, "micro-F1"), **behaviour("R-D2")})
    write_fixture(d, "R-D5", {**paper_values(registry, "R-D5"), **values_of(R_D5_EXTRA, "share of generations valid"),
                              **behaviour("R-D5")})
    write_fixture(d, "R-D6", {**paper_values(registry, "R-D6", smollm_fp32_vanilla_own_p2c_seeds=[0.541, 0.523, 0.53]),
                              **r_d6_row_cells(3), **values_of(R_D6_EXTRA, "difference")})
    write_fixture(d, "R-D18", {**paper_values(registry, "R-D18"), **values_of(R_D18_EXTRA, "difference")})
    return d


@pytest.fixture
def demo_results(registry, tmp_path):
    """A numbers file for every result the demo claims, at its demo expected values, and R-D6's per-seed cells of
    every training seed of the demo profile."""
    from mistill.repro.render import profile_seeds

    d = tmp_path / "results"
    for rid, keys in registry.expected("demo").values.items():
        values = {key: {"value": exp.value, "statistic": exp.stat, "artifact": "fixture"} for key, exp in keys.items()}
        if rid == "R-D6":
            values.update(r_d6_row_cells(len(profile_seeds(REPO, "demo"))))
        if rid in BEHAVIOUR:
            values = {**behaviour(rid, valid=1.0), **values}
        write_fixture(d, rid, values, profile="demo")
    return d


def render(registry, results, out, templates, profile="paper", strict=False):
    report = render_paper(registry, results_dir=results, out_dir=out, templates_dir=templates, profile=profile,
                          strict=strict)
    return report, {t: (out / "tables" / f"{t}.md").read_text() for t in TABLES}


def md_sections(text):
    """Section title -> {row label: [cells]} of a rendered Markdown table (the rows under a section)."""
    return {section: rows for section, rows in md_table(text).items() if section is not None}


def cell(text, section, label, column, columns):
    return md_sections(text)[section][label][columns.index(column) - 1]


def names(profile):
    found = model_names(REPO, profile)
    return {role: model_name(found, role, profile) for role in ("student_qwen", "student_smol", "teacher")}


def test_paper_profile_cells_are_the_numbers_files_values(registry, paper_results, templates, tmp_path):
    report, md = render(registry, paper_results, tmp_path / "build", templates)
    n = names("paper")
    qwen, smol = n["student_qwen"], n["student_smol"]
    qwen_pairs, smol_pairs = f"{qwen}: seed-matched comparisons", f"{smol}: seed-matched comparisons"
    t45 = md_sections(md["table45"])
    assert list(t45) == [qwen, qwen_pairs, smol, smol_pairs]
    # every number the two tables show is in a fixture file; the cells no key holds are "–"
    assert MISSING not in md["table45"] and MISSING not in md["table46"]
    assert not any(k.startswith("tables/") for k in report.missing)

    assert t45[qwen][f"teacher ({n['teacher']}, HD-002)"] == ["0.915", "0.820", "0.847", "–", "–", "–"]
    assert t45[qwen]["untrained"] == ["0.946 (0.043)", "0.310", "0.788 (0.030)", "0.330", "0.340", "0.104"]
    # R-D12's seed grid holds the P2C medians; R-D6 the other phases; R-D2 / R-D17 the seeds' micro-F1
    assert t45[qwen]["Vanilla CoT-KD (fp32), seeds"] == [
        "0.350 / 0.351 / 0.352", "0.360 / 0.361 / 0.362", "0.840 / 0.848 / 0.891", "0.380 / 0.381 / 0.382",
        "0.390 / 0.391 / 0.392", "0.193 / 0.183 / 0.185"]
    assert t45[qwen]["Vanilla CoT-KD (bf16), seeds"][2:] == [
        "0.834 / 0.835 / 0.847", "0.430 / 0.431 / 0.432", "0.440 / 0.441 / 0.442", "0.136 / 0.148 / 0.147"]
    assert t45[qwen]["Mistill, seeds"][2] == "0.873 / 0.870 / 0.874"
    assert t45[qwen]["Mistill, seeds"][5] == "0.151 / 0.148 / 0.149"      # per-seed micro-F1 (R-D5)
    assert t45[qwen]["Mistill (fp32, bf16-selected lambda), seeds"] == ["–", "–", "0.870 / 0.836 / 0.850", "–", "–", "–"]
    assert t45[qwen]["Mistill (fp32, fp32-selected lambda), seeds"][2] == "0.892 / 0.897 / 0.892"
    # seed-matched: R-D6's differences (three decimals, as the paper prints -0.020), R-D18's counts and task interval
    assert t45[qwen_pairs]["Mistill minus bf16 Vanilla CoT-KD"] == [
        "–", "−0.020", "0.027", "–", "–", "−0.006 [−0.021, 0.008]"]
    assert t45[qwen_pairs]["notes Mistill higher (vs bf16)"][2] == "107"
    assert t45[qwen_pairs]["notes Mistill lower (vs bf16)"][1] == "108"
    assert t45[qwen_pairs]["sign test p (vs bf16)"][2] == "2e-07"
    assert t45[qwen_pairs]["Mistill minus fp32 Vanilla CoT-KD"] == [
        "–", "0.019", "0.011", "0.113", "–", "−0.037 [−0.052, −0.022]"]
    assert t45[qwen_pairs]["Mistill minus fp32 Vanilla CoT-KD, M2 at P1 (pooled note pairs)"][3] == "0.170"
    assert t45[qwen_pairs]["Mistill (fp32, bf16-selected lambda) minus fp32 Vanilla CoT-KD"] == [
        "–", "–", "−0.005", "–", "–", "−0.024"]
    assert t45[qwen_pairs]["Mistill (fp32, bf16-selected lambda) minus bf16 Vanilla CoT-KD"][2:4] == ["0.004", "−0.308"]
    assert t45[qwen_pairs]["Mistill (fp32, fp32-selected lambda) minus fp32 Vanilla CoT-KD"] == [
        "–", "–", "0.030", "−0.262", "–", "−0.013"]
    assert t45[qwen_pairs]["seed pairs (fp32, fp32-selected lambda)"][2] == "0.041 / 0.047 / 0.002"
    assert t45[qwen_pairs]["notes Mistill higher (fp32, fp32-selected lambda)"][2] == "118"
    assert t45[smol]["untrained"] == ["0.985 (0.134)", "0.510", "0.416 (0.107)", "0.530", "0.540", "0.003"]
    assert t45[smol]["Vanilla CoT-KD (fp32), seeds"][2:] == [
        "0.541 / 0.523 / 0.530", "0.580 / 0.581 / 0.582", "0.590 / 0.591 / 0.592", "0.148 / 0.113 / 0.129"]
    assert t45[smol]["Vanilla CoT-KD (bf16), seeds"][5] == "0.055 / 0.050 / 0.052"
    assert t45[smol]["Mistill, seeds"] == ["0.650 / 0.651 / 0.652", "0.660 / 0.661 / 0.662", "0.670 / 0.671 / 0.672",
                                           "0.680 / 0.681 / 0.682", "0.690 / 0.691 / 0.692", "0.060 / 0.058 / 0.061"]
    assert t45[smol_pairs]["Mistill minus bf16 Vanilla CoT-KD"] == [
        "–", "−0.041", "0.310", "–", "–", "0.004 [−0.011, 0.019]"]
    assert t45[smol_pairs]["sign test p (vs bf16)"][2] == "6e-21"
    assert t45[smol_pairs]["notes Mistill higher (vs bf16)"][2] == "130"
    assert t45[smol_pairs]["Mistill minus fp32 Vanilla CoT-KD"][1:3] == ["−0.032", "0.233"]

    t46 = md_sections(md["table46"])
    assert list(t46) == [qwen, smol]
    assert t46[qwen]["untrained"] == ["0.104", "0.987", "0.010", "400"]
    assert t46[qwen]["Vanilla CoT-KD (fp32), seeds"] == ["0.193 / 0.183 / 0.185", "0.830", "0.010", "400"]
    assert t46[qwen]["Feature-KD, seeds"] == ["0.160 / 0.141 / 0.158", "0.930", "0.010", "400"]
    assert t46[qwen]["DistiLLM-2 (1 seed)"] == ["0.187", "0.950", "0.010", "400"]
    assert t46[qwen]["OPD (1 seed)"] == ["0.179", "0.973", "0.020", "401"]
    assert t46[qwen]["Vanilla CoT-KD (bf16), seeds"] == ["0.136 / 0.148 / 0.147", "0.900", "0.020", "401"]
    assert t46[qwen]["Mistill, seeds"] == ["0.151 / 0.148 / 0.149", "0.850", "0.010", "400"]
    assert t46[smol]["untrained"] == ["0.003", "0.153", "0.020", "401"]
    assert t46[smol]["Vanilla CoT-KD (fp32), seeds"] == ["0.148 / 0.113 / 0.129", "0.547", "0.020", "401"]
    assert t46[smol]["Feature-KD (1 seed)"] == ["0.062", "0.360", "0.020", "401"]
    assert t46[smol]["GOLD (1 seed)"] == ["0.000", "0.613", "0.030", "402"]
    assert t46[smol]["Vanilla CoT-KD (bf16), seeds"] == ["0.055 / 0.050 / 0.052", "0.380", "0.040", "403"]   # R-D17's valid
    assert t46[smol]["Mistill, seeds"] == ["0.060 / 0.058 / 0.061", "0.289", "0.030", "402"]

    # a per-seed cell shows one entry per seed of the paper's three
    for text in md.values():
        for rows in md_sections(text).values():
            for row in rows.values():
                assert all(c.count(" / ") == 2 for c in row if " / " in c), row
    tex = (tmp_path / "build" / "tables" / "table45.tex").read_text()
    assert r"Mistill (fp32, bf16-selected lambda) minus fp32 Vanilla CoT-KD & -- & -- & $-$0.005 & -- & -- & $-$0.024 \\" in tex
    assert r"\label{tab:per-seed-own-heads}" in tex
    tex = (tmp_path / "build" / "tables" / "table46.tex").read_text()
    assert r"OPD (1 seed) & 0.179 & 0.973 & 0.020 & 401 \\" in tex


def test_demo_profile_shows_every_seed_and_fills_every_cell_it_computes(registry, demo_results, templates, tmp_path):
    # strict: no number the demo claims is missing from either table
    report, md = render(registry, demo_results, tmp_path / "build", templates, profile="demo", strict=True)
    n = names("demo")
    qwen, smol = n["student_qwen"], n["student_smol"]
    qwen_pairs, smol_pairs = f"{qwen}: seed-matched comparisons", f"{smol}: seed-matched comparisons"
    demo = registry.expected("demo").values
    t45, t46 = md_sections(md["table45"]), md_sections(md["table46"])
    assert list(t45) == [qwen, qwen_pairs, smol, smol_pairs] and list(t46) == [qwen, smol]

    # every training seed of the profile: a per-seed cell shows each seed's number (R-D12's grid holds the P2C medians)
    def joined(values):
        return " / ".join(minus_sign(f"{x:.3f}") for x in values)

    seeds = len(demo["R-D12"]["qwen_mistill_own_p2c_seeds"].value)
    mistill = t45[qwen]["Mistill, seeds"]
    assert [mistill[i] for i in (0, 1, 3, 4)] == [joined(r_d6_seeds("qwen_mistill", R_D6_CELLS[i], seeds))
                                                 for i in (0, 1, 3, 4)]
    assert mistill[2] == joined(demo["R-D12"]["qwen_mistill_own_p2c_seeds"].value)
    assert mistill[5] == joined(demo["R-D5"]["qwen_mistill_microf1_seeds"].value)
    assert t45[qwen]["Vanilla CoT-KD (fp32), seeds"][5] == joined(demo["R-D2"]["qwen_vanilla_fp32_microf1_seeds"].value)
    assert t46[smol]["Vanilla CoT-KD (fp32), seeds"][0] == joined(demo["R-D2"]["smollm_vanilla_fp32_microf1_seeds"].value)
    assert t46[qwen]["Mistill, seeds"][0] == joined(demo["R-D5"]["qwen_mistill_microf1_seeds"].value)

    # ?? only where the demo computes nothing: Feature-KD's seeds 1 and 2; the baseline rows (R-D3, R-D4), the fp32
    # Mistill arms at either lambda (R-D17, R-D30) and SmolLM's bf16 valid rate are filled
    shown = {(t, section, label, col) for t, text in md.items() for section, rows in md_sections(text).items()
             for label, row in rows.items() for col, c in zip(T45[1:] if t == "table45" else T46[1:], row)
             if MISSING in c}
    assert shown == {("table46", qwen, "Feature-KD, seeds", "micro-F1")}   # the demo trains Feature-KD at seed 0 alone
    selected = t45[qwen]["Mistill (fp32, fp32-selected lambda), seeds"]
    assert selected[2] == joined(demo["R-D30"]["mistill_fp32_l001_seed_medians"].value)
    transferred = t45[qwen]["Mistill (fp32, bf16-selected lambda), seeds"]
    assert transferred[2] == joined(demo["R-D17"]["qwen_fp32_mistill_own_p2c_seeds"].value)
    assert report.claimed == set()
    # the seed-matched lines the demo computes: R-D6's differences, R-D18's counts, sign tests and task intervals
    row = t45[qwen_pairs]["Mistill minus bf16 Vanilla CoT-KD"]
    assert row[2] == f"{demo['R-D6']['qwen_mistill_minus_bf16_vanilla_p2c'].value:.3f}".replace("-", "−")
    low, high = demo["R-D18"]["qwen_per_note_microf1_mistill_minus_bf16_vanilla_interval"].value
    assert row[5].endswith(f"[{low:.3f}, {high:.3f}]".replace("-", "−"))
    assert t45[smol_pairs]["notes Mistill higher (vs bf16)"][2] == str(demo["R-D18"]["smollm_note_clustered_p2c_higher_notes"].value)


def set_value(results, rid, key, new):
    """Rewrite one value of a fixture numbers file."""
    path = results / f"{rid}.json"
    data = json.loads(path.read_text())
    data["values"][key]["value"] = new
    path.write_text(json.dumps(data))


# other: lines of the other table that move too (a per-seed micro-F1 list feeds both tables' cells)
@pytest.mark.parametrize("table, rid, key, new, section, label, column, shown, other", [
    ("table45", "R-D17", "qwen_fp32_mistill_vs_fp32_vanilla_own_p2c", -0.007, "qwen_pairs",
     "Mistill (fp32, bf16-selected lambda) minus fp32 Vanilla CoT-KD", "M4 P2C", "−0.007", 0),
    ("table45", "R-D12", "qwen_mistill_own_p2c_seeds", [0.873, 0.861, 0.874], "qwen", "Mistill, seeds", "M4 P2C",
     "0.873 / 0.861 / 0.874", 0),
    ("table45", "R-D6", "smollm_mistill_m2_lift_p2c_seeds", [0.68, 0.699, 0.682], "smol", "Mistill, seeds", "M2 lift",
     "0.680 / 0.699 / 0.682", 0),
    ("table45", "R-D18", "smollm_per_note_microf1_mistill_minus_fp32_vanilla_interval", [-0.104, -0.059], "smol_pairs",
     "Mistill minus fp32 Vanilla CoT-KD", "task", "−0.080 [−0.104, −0.059]", 0),
    ("table46", "R-D4", "opd_valid_rate", 0.951, "qwen", "OPD (1 seed)", "valid", "0.951", 0),
    ("table46", "R-D3", "smollm_featurekd_valid_rate", 0.371, "smol", "Feature-KD (1 seed)", "valid", "0.371", 0),
    ("table46", "R-D2", "smollm_vanilla_fp32_microf1_seeds", [0.148, 0.117, 0.129], "smol",
     "Vanilla CoT-KD (fp32), seeds", "micro-F1", "0.148 / 0.117 / 0.129", 1),
])
def test_changing_one_number_moves_exactly_its_cell(registry, paper_results, templates, tmp_path, table, rid, key, new,
                                                    section, label, column, shown, other):
    n = names("paper")
    section = {"qwen": n["student_qwen"], "smol": n["student_smol"],
               "qwen_pairs": f"{n['student_qwen']}: seed-matched comparisons",
               "smol_pairs": f"{n['student_smol']}: seed-matched comparisons"}[section]
    columns = T45 if table == "table45" else T46
    _, before = render(registry, paper_results, tmp_path / "before", templates)
    set_value(paper_results, rid, key, new)
    _, after = render(registry, paper_results, tmp_path / "after", templates)
    assert cell(after[table], section, label, column, columns) == shown
    assert cell(before[table], section, label, column, columns) != shown
    # only that cell moved: one line of that table, one cell of that line (and the other table's cell of the same key)
    for t, lines in ((table, 1), (next(t for t in TABLES if t != table), other)):
        diff = [(a, b) for a, b in zip(before[t].splitlines(), after[t].splitlines()) if a != b]
        assert len(diff) == lines, t
        for a, b in ((md_cells(a), md_cells(b)) for a, b in diff):
            assert len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1
            assert shown in b
    tex = (tmp_path / "after" / "tables" / f"{table}.tex").read_text()
    assert shown.replace("−", "$-$") in tex
