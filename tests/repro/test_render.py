"""The renderer on fixture numbers files: Tables 1-3, App. A's K sweep and macros.tex, every cell from a
numbers file."""

import json
import re
import shutil

import pytest

from mistill.errors import UserError
from mistill.repro.render import MISSING, render_paper
from tests.repro.repro_helpers import REPO, paper_values, write_fixture

TEMPLATES = REPO / "paper" / "templates"
TABLE_IDS = {"table1": ["R-C3"],
             "table2": ["R-D1", "R-D2", "R-D3", "R-D4", "R-D5", "R-D17", "R-D22", "R-D30"],
             "table3": ["R-D6", "R-D12", "R-D13", "R-D15", "R-D17", "R-D22", "R-D27", "R-D30"],
             "table39": ["R-D10"], "table41": ["R-D10"], "table43": ["R-D18"], "table44": ["R-D21", "R-D0"], "tableA_ksweep": ["R-D0"],
             "table9": ["R-C8"], "table15": ["R-C13"], "table35": ["R-C7"], "table38": ["R-D19"],
             "table36": ["R-C15", "R-C3", "R-C4"], "table37": ["R-C15", "R-C6"],
             "table16": ["R-C5"], "table17": ["R-C5"], "table18": ["R-C5"], "table19": ["R-C5"],
             "table20": ["R-C10"], "table21": ["R-C11"], "table22": ["R-D28"], "table23": ["R-C11"],
             "table5": ["R-C9"], "table24": ["R-C9"], "table54": ["R-D33"], "table55": ["R-D34"],
             "table6": ["R-C1"], "table7": ["R-C1"], "table8": ["R-C2"], "table10": ["R-C3"], "table11": ["R-C4"],
             "table13": ["R-C4"], "table14": ["R-C3"], "table25": ["R-C13"],
             "table26": ["R-C6"], "table27": ["R-C6"], "table29": ["R-C6"], "table30": ["R-C6"], "table32": ["R-C6"],
             "table33": ["R-C6"], "table31": ["R-C12"], "table4": ["R-C14"], "table51": ["R-D7", "R-D13", "R-D14", "R-D23", "R-D24", "R-D25", "R-D26", "R-D5"],
             "table45": ["R-D1", "R-D2", "R-D5", "R-D6", "R-D12", "R-D15", "R-D17", "R-D18", "R-D30"],
             "table46": ["R-D1", "R-D2", "R-D3", "R-D4", "R-D5", "R-D17"], "table52": ["R-D31", "R-D32"],
             "table53": ["R-D8"], "table49": ["R-D29", "R-D30", "R-D36"],
             "directions": ["R-D5", "R-D6", "R-D18", "R-D19"]}
# Tables whose every cell this file's fixture fills (the others have their own tests: tests/repro/test_tables_*.py)
FILLED = ["table1", "table2", "table3", "table43", "table44", "tableA_ksweep", "table9", "table15", "table35",
          "table38", "table16", "table17", "table18", "table19", "table20", "table21", "table22", "table23",
          "table5", "table24", "table54", "table55", "table10", "table14", "table25", "table26", "table27", "table29",
          "table30", "table31", "table32", "table33", "table4", "table51", "table36", "table37"]
# App. A's K sweep was lost in the extraction: no expected values, so the fixture writes its own
K_SWEEP = {"k_sweep_k": [200, 1000], "k_sweep_completed_recall_validation": [0.81, 0.903],
           "k_sweep_completed_recall_test": [0.85, 0.936], "k_sweep_completed_recall_corpus": [0.84, 0.939],
           "k_sweep_median_shortlist_length": [230.0, 1012.5]}
ALL_TABLE_IDS = sorted({i for ids in TABLE_IDS.values() for i in ids})


def render(registry, results, out, strict=False, templates=TEMPLATES):
    return render_paper(registry, results_dir=results, out_dir=out, templates_dir=templates, profile="paper",
                        strict=strict)


@pytest.fixture
def results(registry, tmp_path):
    d = tmp_path / "results"
    for rid in ALL_TABLE_IDS:
        write_fixture(d, rid, paper_values(registry, rid))
    sweep = {k: {"value": v, "statistic": "recall per K", "artifact": "fixture"} for k, v in K_SWEEP.items()}
    write_fixture(d, "R-D0", {**paper_values(registry, "R-D0"), **sweep})
    # Table 44's precision and recall of the top-10 and of the whole shortlist are not in the paper's text
    extra = {"retriever_top10_precision": 0.15, "retriever_top10_recall": 0.22, "retriever_shortlist_microf1": 0.031,
             "retriever_shortlist_precision": 0.016, "retriever_shortlist_recall": 0.936}
    write_fixture(d, "R-D21", {**paper_values(registry, "R-D21"),
                               **{k: {"value": x, "statistic": "micro-F1", "artifact": "fixture"}
                                  for k, x in extra.items()}})
    # Table 43's per-note differences, the other pairs and every interval are the reader's own keys
    pairs = {f"{f}_{e}_microf1_mistill_minus_{t}_vanilla": 0.01 for f in ("qwen", "smollm") for t in ("bf16", "fp32")
             for e in ("per_note", "corpus")}
    pairs["corpus_microf1_mistill_minus_bf16_vanilla"] = pairs.pop("qwen_corpus_microf1_mistill_minus_bf16_vanilla")
    pairs.update({f"{k}_interval": [-0.007, 0.019] for k in list(pairs)})
    write_fixture(d, "R-D18", {**paper_values(registry, "R-D18"),
                               **{k: {"value": x, "statistic": "micro-F1 difference", "artifact": "fixture"}
                                  for k, x in pairs.items() if k != "corpus_microf1_mistill_minus_bf16_vanilla"}})
    # Table 31's interval is the paper's printed one ([1.33, 1.79]), a key of the reader's own
    write_fixture(d, "R-C12", {**paper_values(registry, "R-C12"), "natural_drop_vs_random_per_note_interval": {
        "value": [1.33, 1.79], "statistic": "95% percentile bootstrap over notes", "artifact": "fixture"}})
    # Table 4's knock-in cells beside the criteria are the reader's own keys (the paper's body is lost)
    control = {"orig_sets_beat_random_notes_of": [30, 28], "criteria_met": [1, 1, 1],
               "inherited_share_no_instruction_with": [20.0, 27.0], "knockin_orig_sets_p1_p2c": [0.81, 0.62],
               "knockin_random_p1_p2c": [0.04, 0.03], "knockin_reranked_sets_p1_p2c": [0.83, 0.64],
               "knockin_hd001_same_notes_p1_p2c": [0.82, 0.63], "hd001_same_notes_beat_random_p1_p2c": [30, 28]}
    write_fixture(d, "R-C14", {**paper_values(registry, "R-C14"),
                               **{k: {"value": x, "statistic": "count", "artifact": "fixture"} for k, x in control.items()}})
    # Table 51's Mistill row: its M2 lift at P1 and micro-F1 are the reader's own keys (the paper quotes them in prose)
    reference = {"mistill_s0_m2_lift_p1": 2.26, "mistill_s0_microf1": 0.151,
                 "nowindow_minus_mistill_p2c_interval": [-0.01, -0.006]}
    write_fixture(d, "R-D25", {**paper_values(registry, "R-D25"),
                               **{k: {"value": x, "statistic": "share", "artifact": "fixture"} for k, x in reference.items()}})
    reference = {"mistill_s0_m2_lift_p2c": 3.65, "mistill_s0_microf1": 0.151, "mistill_s0_cap_rate": 0.12,
                 "mistill_s0_m1_p2c": 0.802, "uniform_vs_mistill_s0_p2c_interval": [0.03, 0.06]}
    write_fixture(d, "R-D24", {**paper_values(registry, "R-D24"),
                               **{k: {"value": x, "statistic": "share", "artifact": "fixture"} for k, x in reference.items()}})
    # Table 51's ablation footnotes: the F1 differences against Mistill are the paper's prose; the untrained row is R-D7's
    ablation = {"p1only_minus_mistill_f1": -0.022, "p2only_minus_mistill_f1": 0.004, "attnonly_minus_mistill_f1": -0.019,
                "interonly_minus_mistill_f1": 0.010, "lambda_003_003_minus_mistill_f1": -0.002, "untrained_own_p2c": 0.788}
    write_fixture(d, "R-D14", {**paper_values(registry, "R-D14"),
                               **{k: {"value": x, "statistic": "share", "artifact": "fixture"} for k, x in ablation.items()}})
    # Table 38's Qwen3-4B row and the students' second denominator are the reader's own keys
    qwen = {"qwen_event_coverage_p1": 100.0, "qwen_event_coverage_p2": 61.0, "qwen_event_coverage_p2c": 80.0,
            "qwen_realized_events": 47000, "qwen_per_note_coverage_median": 0.8,
            "qwen_aligned_subset_gain_vs_fp32": 0.041, "smollm_event_coverage_p1": 100.0,
            "aligned_p2c_events": 1400, "knockin_denominator_students_p2c": [0.56, 0.68]}
    write_fixture(d, "R-D19", {**paper_values(registry, "R-D19"),
                               **{k: {"value": x, "statistic": "share", "artifact": "fixture"} for k, x in qwen.items()}})
    write_fixture(d, "R-D6", {**paper_values(registry, "R-D6", smollm_fp32_vanilla_own_p2c_seeds=[0.419, 0.42, 0.43]),
                              **R_D6_ROW_CELLS})
    # Table 2's valid rates of the Qwen3-4B arms: the readers' own keys (the paper's text prints none)
    valid = {"statistic": "share of generations valid", "artifact": "fixture"}
    write_fixture(d, "R-D2", {**paper_values(registry, "R-D2"), "qwen_vanilla_fp32_valid_rate": {"value": 0.83, **valid}})
    write_fixture(d, "R-D5", {**paper_values(registry, "R-D5"), "qwen_vanilla_bf16_valid_rate": {"value": 0.81, **valid},
                              "qwen_mistill_valid_rate": {"value": 0.85, **valid}})
    # the baseline rows' cells the paper prints no number for (Tables 2, 43, 46): the readers' own keys
    for rid in ("R-D2", "R-D3", "R-D4"):
        known = json.loads((d / f"{rid}.json").read_text())["values"]
        extra = {key: {"value": _placeholder(key), "statistic": "share", "artifact": "fixture"}
                 for key in registry.results[rid].extra_keys if key not in known}
        write_fixture(d, rid, {**known, **extra})
    return d


def _placeholder(key: str):
    """A value of the shape a reader writes under `key`: per-seed lists, intervals and M1 triples are lists."""
    if key.endswith("_seeds"):
        return [0.41, 0.42, 0.43]
    if key.endswith("_interval"):
        return [-0.02, 0.01]
    if key.endswith(("_m1_p1_p2_p2c",)):
        return [0.8, 0.7, 0.75]
    if key.endswith("_m1_p1_p2c"):
        return [0.8, 0.75]
    return 0.5


# Table 3's cells the paper prints no number for: R-D6's per-seed cells of every arm row (three seeds)
R_D6_ROWS = ("qwen_untrained", "qwen_vanilla_fp32", "qwen_vanilla_bf16", "qwen_mistill",
             "smollm_untrained", "smollm_vanilla_fp32", "smollm_vanilla_bf16", "smollm_mistill")
R_D6_ROW_CELLS = {
    **{f"{row}_{cell}_seeds": {"value": [0.61, 0.62, 0.63], "statistic": "per-seed medians", "artifact": "fixture"}
       for row in R_D6_ROWS for cell in ("own_p1", "own_p2", "own_p2c", "m2_lift_p2c", "prefix_share_p2c")},
    **{f"{row}_{cell}_p2c_seed_mean": {"value": 0.62, "statistic": "mean over seeds", "artifact": "fixture"}
       for row in R_D6_ROWS for cell in ("own", "m2_lift", "prefix_share")},
    "teacher_hd002_p1_k40": {"value": 0.92, "statistic": "median over notes", "artifact": "fixture"},
    "teacher_hd002_p2_k40": {"value": 0.82, "statistic": "median over notes", "artifact": "fixture"}}


def md_row(text, label):
    return next(line for line in text.splitlines() if line.startswith(f"| {label} |")).split(" | ")


def test_tables_render_every_cell_from_numbers_files(registry, results, tmp_path):
    out = tmp_path / "build"
    report = render(registry, results, out)
    names = sorted(p.name for p in (out / "tables").iterdir())
    assert names == sorted(f"{t}.{fmt}" for t in TABLE_IDS for fmt in ("md", "tex"))
    for name in (f"{t}.{fmt}" for t in FILLED for fmt in ("md", "tex")):
        assert MISSING not in (out / "tables" / name).read_text(), name
        assert f"tables/{name}" not in report.missing, name
    t1 = (out / "tables" / "table1.md").read_text()
    assert md_row(t1, "top-8")[1:] == ["0.62", "0.78", "0.63 |"]
    assert md_row(t1, "notes: top-40 beats random")[1:] == ["100", "100", "92 |"]
    t2 = (out / "tables" / "table2.tex").read_text()
    assert r"Vanilla CoT-KD (fp32) & 0.187 $\pm$ 0.007 & 0.830 & 0.267 & 0.173 & 1.516 & 0.888 & -- & 0.791 \\" in t2
    t3 = (out / "tables" / "table3.md").read_text()
    assert md_row(t3, "untrained")[1] == "0.946 (0.043)"
    assert md_row(t3, "Mistill, seeds")[3] == "0.873 / 0.870 / 0.874"
    t43 = (out / "tables" / "table43.md").read_text()   # the paper prints +0.006 [-0.007, +0.019] (3 decimals)
    assert md_row(t43, "Mistill minus bf16 Vanilla CoT-KD")[2] == "0.006 [−0.007, 0.019] |"
    t44 = (out / "tables" / "table44.md").read_text()
    assert md_row(t44, "retriever, top-20 codes")[1:] == ["0.217", "0.191", "0.249 |"]
    assert md_row(t44, "teacher (shortlist prompt)")[1:] == ["0.227", "–", "– |"]
    t9 = (out / "tables" / "table9.md").read_text()
    assert md_row(t9, "P2 top-40 shared")[1] == "30 |" and md_row(t9, "P2 top-8 shared")[1] == "5 |"
    assert [md_row(t9, h)[1] for h in ("L39H10", "L39H29", "L39H12", "L37H6")] == ["2 |", "4 |", "3 |", "9 |"]
    assert md_row(t9, "P2C top-40 shared")[1] == "31 |"
    t35 = (out / "tables" / "table35.md").read_text()
    assert md_row(t35, "P1 (chapter)")[1:] == ["0.55", "31", "0.92", "0.04 |"]
    assert md_row(t35, "P2C (contrastive)")[1:] == ["0.55", "32", "0.85", "0.02 |"]
    t15 = (out / "tables" / "table15.md").read_text()
    assert "| top-40 shared by the halves (median; range over phases where two) | 36, 37 |" in t15
    t38 = (out / "tables" / "table38.md").read_text()
    assert md_row(t38, "SmolLM3-3B")[2:5] == ["53", "73", "41824"]
    assert "teacher 0.71, students 0.560–0.680; contrastive events both realise: 1400." in t38
    t25 = (out / "tables" / "table25.md").read_text()    # window shares are registered in the order D, A, B
    assert [md_row(t25, s)[1] for s in ("B (the paper's suffix)", "D", "A")] == ["36.10", "43.20", "43.60"]   # at least 2 decimals
    assert md_row(t25, "D")[3] == "80.10 |" and "on the same 90 notes and 1861 chapter mentions" in t25
    ksweep = (out / "tables" / "tableA_ksweep.md").read_text()
    assert [md_row(ksweep, k) for k in ("200", "1000")] == [["| 200", "0.810", "0.850", "0.840", "230.0 |"],
                                                            ["| 1000", "0.903", "0.936", "0.939", "1012.5 |"]]


@pytest.mark.parametrize("table, rid, key, new, label, column", [
    ("table1", "R-C3", "necessity_top8_p1", 0.71, "top-8", 1),
    ("table2", "R-D4", "opd_las", 0.333, "OPD (1 seed)", 3),
    ("table3", "R-D27", "mean_of_per_seed_medians", 0.699, "Mistill (mean of seed medians)", 3),
])
def test_changing_one_number_moves_its_cell(registry, results, tmp_path, table, rid, key, new, label, column):
    render(registry, results, tmp_path / "before")
    values = json.loads((results / f"{rid}.json").read_text())["values"]
    write_fixture(results, rid, {**values, key: {**values[key], "value": new}})
    render(registry, results, tmp_path / "after")
    before = (tmp_path / "before" / "tables" / f"{table}.md").read_text()
    after = (tmp_path / "after" / "tables" / f"{table}.md").read_text()
    assert md_row(after, label)[column].rstrip(" |") == f"{new}"
    assert md_row(before, label)[column] != md_row(after, label)[column]
    # Only that cell moved.
    diff = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
    assert len(diff) == 1
    assert f"{new}" in (tmp_path / "after" / "tables" / f"{table}.tex").read_text()


def test_normal_mode_shows_question_marks_and_says_which(registry, results, tmp_path):
    (results / "R-C3.json").unlink()
    report = render(registry, results, tmp_path / "build")
    t1 = (tmp_path / "build" / "tables" / "table1.md").read_text()
    assert md_row(t1, "top-8")[1:] == ["??", "??", "?? |"]
    assert "R-C3.necessity_top8_p1" in report.missing["tables/table1.md"]
    assert "tables/table2.md" not in report.missing


def test_a_shorter_per_seed_list_leaves_the_absent_seeds_missing(registry, results, tmp_path):
    """A profile with fewer seeds than the paper's (the demo trains one) fills the seeds it has."""
    write_fixture(results, "R-D6", {**paper_values(registry, "R-D6", smollm_fp32_vanilla_own_p2c_seeds=[0.419]),
                                    **R_D6_ROW_CELLS})
    report = render(registry, results, tmp_path / "build")
    t3 = (tmp_path / "build" / "tables" / "table3.md").read_text()
    smollm_rows = t3.split("SmolLM3-3B")[1]  # the second "Vanilla CoT-KD (fp32), seeds" row
    assert md_row(smollm_rows, "Vanilla CoT-KD (fp32), seeds")[3] == "0.419 / ?? / ??"
    assert {"R-D6.smollm_fp32_vanilla_own_p2c_seeds[1]", "R-D6.smollm_fp32_vanilla_own_p2c_seeds[2]"} <= set(
        report.missing["tables/table3.md"])


def test_a_cell_reads_the_first_result_that_holds_it(registry, results, tmp_path):
    """Table 3's Qwen3-4B arms read R-D12's seed grid, and R-D6's own per-seed cells where R-D12 is absent."""
    render(registry, results, tmp_path / "grid")
    t3 = (tmp_path / "grid" / "tables" / "table3.md").read_text()
    assert md_row(t3, "Mistill, seeds")[3] == "0.873 / 0.870 / 0.874"      # R-D12's
    (results / "R-D12.json").unlink()
    report = render(registry, results, tmp_path / "own")
    t3 = (tmp_path / "own" / "tables" / "table3.md").read_text()
    assert md_row(t3, "Mistill, seeds")[3] == "0.610 / 0.620 / 0.630"      # R-D6's, for the same seeds
    assert not any(m.startswith("R-D12.qwen_mistill") for m in report.missing.get("tables/table3.md", []))
    (results / "R-D6.json").unlink()
    report = render(registry, results, tmp_path / "none")
    t3 = (tmp_path / "none" / "tables" / "table3.md").read_text()
    assert md_row(t3, "Mistill, seeds")[3] == "?? / ?? / ??"
    assert {"R-D12.qwen_mistill_own_p2c_seeds[0]", "R-D6.qwen_mistill_own_p2c_seeds[0]"} <= set(
        report.missing["tables/table3.md"])


def test_per_seed_cells_follow_the_profiles_seeds(registry, results, tmp_path, monkeypatch):
    """A profile that trains one seed shows one number per seed cell: the rehearsal's and the paper's three."""
    from mistill.repro import render as render_module

    assert render_module.profile_seeds(REPO, "paper") == [0, 1, 2]
    assert render_module.profile_seeds(REPO, "demo") == [0, 1, 2]
    (results / "R-D12.json").unlink()
    monkeypatch.setattr(render_module, "profile_seeds", lambda root, profile: [0])
    render(registry, results, tmp_path / "one")
    t3 = (tmp_path / "one" / "tables" / "table3.md").read_text()
    assert md_row(t3, "Mistill, seeds")[1:4] == ["0.610", "0.610", "0.610"]
    t2 = (tmp_path / "one" / "tables" / "table2.md").read_text()     # one seed: the mean, no "± sd"
    assert md_row(t2, "Vanilla CoT-KD (fp32)")[1] == "0.187"


def test_strict_mode_fails_on_a_missing_number_and_writes_nothing(registry, results, tmp_path):
    (results / "R-D27.json").unlink()
    with pytest.raises(UserError) as err:
        render(registry, results, tmp_path / "build", strict=True)
    assert "strict" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "build").exists()


def test_macros_hold_one_command_per_registered_value(registry, results, tmp_path):
    render(registry, results, tmp_path / "build")
    text = (tmp_path / "build" / "macros.tex").read_text()
    commands = dict(re.findall(r"\\newcommand\{\\([A-Za-z]+)\}\{(.*)\}", text))
    scalars = sum(len(registry.registered_keys(rid)) for rid in registry.results)
    # A list value gets one part macro per element, in the shape of the first profile that registers it.
    shapes: dict[tuple[str, str], int] = {}
    for profile in registry.profiles:
        for rid, vals in registry.expected(profile).values.items():
            for key, e in vals.items():
                shapes.setdefault((rid, key), len(e.value) if isinstance(e.value, list) else 0)
    parts = sum(shapes.values())
    assert len(commands) == scalars + parts
    assert commands["RCthreeKnockinTopFortyPOne"] == "0.86"
    assert commands["RDoneSmollmThreeThreeBUntrainedMOnePOnePTwoPTwoC"] == "0.731, 0.379, 0.721"
    assert commands["RDoneSmollmThreeThreeBUntrainedMOnePOnePTwoPTwoCPartTwo"] == "0.379"
    assert commands["RDthreeQwenFeaturekdMinusFpThirtyTwoVanilla"] == "$-$0.035"
    assert commands["RDthirtysevenMqMistillMinusVanillaRecovery"] == MISSING   # R-D37 has no fixture file


def test_template_naming_an_unknown_key_is_an_error_with_no_output(registry, results, tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES, templates)
    (templates / "tables" / "table9.j2").write_text(
        '{# reads: R-C3 #}\n{{ v("R-C3", "necessity_top9_p1")|cell(fmt) }}\n')
    with pytest.raises(UserError) as err:
        render(registry, results, tmp_path / "build", templates=templates)
    assert "table9.j2: R-C3 has no registered value key 'necessity_top9_p1'" in str(err.value)
    assert not (tmp_path / "build").exists()


@pytest.mark.parametrize("body, message", [
    ('{# reads: R-C3 #}\n{{ v("R-C4", "l30h11_rank_p2c")|cell(fmt) }}\n', "without declaring it"),
    ('{# reads: R-C33 #}\nx\n', "reads unknown result id(s) R-C33"),
    ('{{ v("R-C3", "necessity_top8_p1")|cell(fmt) }}\n', "must start with"),
    ('{# reads: R-C3 #}\n{{ undefined_thing }}\n', "undefined"),
])
def test_bad_templates_are_one_line_errors(registry, results, tmp_path, body, message):
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES, templates)
    (templates / "tables" / "bad.j2").write_text(body)
    with pytest.raises(UserError) as err:
        render(registry, results, tmp_path / "build", templates=templates)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "build").exists()


def test_malformed_numbers_file_stops_rendering_before_any_output(registry, results, tmp_path):
    (results / "R-D5.json").write_text('{"id": "R-D5"')
    with pytest.raises(UserError, match="malformed numbers file"):
        render(registry, results, tmp_path / "build")
    assert not (tmp_path / "build").exists()


def test_cli_render_reports_missing_and_strict_exits_2(results, tmp_path, monkeypatch, capsys):
    from mistill.cli import main

    monkeypatch.chdir(REPO)
    args = ["repro", "render", "--profile", "paper", "--results", str(results), "--out", str(tmp_path / "b")]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "macros.tex: ?? for R-D" in err     # claimed paper numbers no fixture file holds (R-D9's, R-D37's)
    assert main(args + ["--strict"]) == 2
    assert "strict" in capsys.readouterr().err


def test_the_summary_counts_captioned_tables_with_a_template_and_complete_ones(registry, results, tmp_path):
    assert registry.captioned_tables() == set(range(1, 61)) - {34}    # Table 34 has no caption in the paper
    full = render(registry, results, tmp_path / "full").tables()
    assert sorted(full) == sorted(TABLE_IDS) and all(full[name] for name in FILLED)
    (results / "R-C3.json").unlink()
    report = render(registry, results, tmp_path / "partial")
    reading_c3 = {name for name, ids in TABLE_IDS.items() if "R-C3" in ids}
    assert report.tables() == {name: done and name not in reading_c3 for name, done in full.items()}
    complete = sum(report.tables().values())
    numbered = {int(name[len("table"):]) for name in TABLE_IDS if name[len("table"):].isdigit()}
    assert report.tables_summary(registry.captioned_tables()) == (
        f"tables: {len(numbered)} of the paper's 59 captioned tables have a template ({len(TABLE_IDS)} templates "
        f"in all); {complete} complete under profile paper (no ??), {len(TABLE_IDS) - complete} with "
        "?? cells; no template yet: " + ", ".join(str(n) for n in sorted(registry.captioned_tables() - numbered)))
