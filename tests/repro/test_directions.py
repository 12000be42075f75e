"""The Mistill-versus-Vanilla direction table: the direction rule, which keys are rows, README's copy of the table
and the renderer's template (paper/templates/tables/directions.j2)."""

import json
import re
import shutil

import pytest

from mistill.cli import main
from mistill.errors import UserError
from mistill.repro.directions import (
    DIRECTION_RESULTS,
    README_BEGIN,
    README_END,
    direction,
    directions_agree,
    is_direction_key,
    read_direction_rows,
    readme_block,
)
from mistill.repro.render import MISSING, render_paper
from tests.repro.repro_helpers import REPO, md_cells, templates_with, write_fixture


def values_of(numbers: dict, statistic: str = "Mistill minus bf16 Vanilla CoT-KD") -> dict:
    return {key: {"value": x, "statistic": statistic, "artifact": "fixture"} for key, x in numbers.items()}


@pytest.fixture(scope="module")
def committed_rows():
    return read_direction_rows(REPO, "demo", REPO / "results")


def by_key(rows, result_id, key):
    return next(row for row in rows if (row.result_id, row.key) == (result_id, key))


# --- the direction rule, worked by hand ---------------------------------------------------------------------

@pytest.mark.parametrize("value, interval, expected", [
    (0.05, (0.01, 0.09), "+"),          # the interval lies above 0
    (-0.10, (-0.20, -0.02), "-"),       # below 0
    (0.02, (-0.03, 0.08), "0"),         # holds 0
    (0.02, (0.0, 0.04), "0"),           # an end on 0 holds it
    (-0.3, (0.01, 0.09), "+"),          # the interval decides, not the value
    (0.03, None, "(+)"),                # no interval: the value's sign, marked
    (-0.03, None, "(-)"),
    (0.0, None, "(0)"),
    (None, None, "?"),                  # nothing to read
])
def test_the_direction_of_an_interval_or_of_a_value_without_one(value, interval, expected):
    assert direction(value, interval) == expected


@pytest.mark.parametrize("run, paper, expected", [
    ("+", "+", True), ("0", "0", True), ("(+)", "+", True), ("(-)", "(-)", True),
    ("-", "(+)", False), ("0", "(+)", False),     # an interval holding 0 is no direction, a bare sign is one
    ("(0)", "(-)", False), ("+", "–", None), ("?", "+", None),
])
def test_directions_agree_on_the_same_symbol_with_the_parentheses_dropped(run, paper, expected):
    assert directions_agree(run, paper) is expected


# --- which keys are rows --------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, kinds", [
    ("qwen_mistill_minus_bf16_vanilla_p2c", ["share"]),
    ("qwen_m2_mistill_minus_fp32_vanilla_p1", ["share"]),      # ends in _p1: a phase, not a p-value
    ("smollm_mistill_vs_bf16_vanilla_per_note", ["share"]),
    ("m1_p2c_pooled_mean_diff_vs_bf16", ["share"]),
    ("qwen_note_clustered_p2c_gain_vs_bf16", []),
    ("smollm_aligned_subset_gain_vs_fp32", ["share"]),
])
def test_a_mistill_minus_vanilla_difference_is_a_row(key, kinds):
    assert is_direction_key(key, kinds)


@pytest.mark.parametrize("key, kinds", [
    ("qwen_mistill_vs_bf16_p2c_sign_p", ["p_value"]),           # a p-value, by its kind
    ("qwen_mistill_vs_bf16_p2c_sign_p", []),                    # and by its name
    ("task_note_pairs_mistill_vs_bf16", ["count"]),             # a pair tally
    ("smollm_task_pairs_vs_bf16", []),
    ("qwen_mistill_minus_bf16_vanilla_p2_lower_notes", []),     # a count of notes
    ("qwen_mistill_minus_bf16_vanilla_p2c", ["share", "count"]),   # a count under either profile
    ("qwen_note_clustered_p2c_gain_vs_bf16_interval", ["share"]),  # the interval of another row
    ("corpus_vs_per_note_interval_endpoint_gap_max", ["share"]),   # compares two estimands, not Mistill
    ("own_all_heads_knockin_minus_clean_max_abs", ["nats"]),
])
def test_p_values_counts_tallies_and_intervals_are_not_rows(key, kinds):
    assert not is_direction_key(key, kinds)


def test_the_committed_rows_leave_out_every_p_value_and_count(committed_rows, registry):
    keys = {(row.result_id, row.key) for row in committed_rows}
    assert ("R-D6", "qwen_mistill_vs_bf16_p2c_sign_p") not in keys
    assert ("R-D18", "qwen_note_clustered_p2c_sign_p") not in keys
    assert ("R-D5", "task_note_pairs_mistill_vs_bf16") not in keys
    assert ("R-D6", "qwen_mistill_minus_bf16_vanilla_p2") in keys
    kinds = {exp.kind for profile in ("demo", "paper") for rid in DIRECTION_RESULTS
             for key, exp in registry.expected(profile).values[rid].items() if (rid, key) in keys}
    assert kinds == {"share"}
    assert [row.result_id for row in committed_rows] == sorted(
        (row.result_id for row in committed_rows), key=DIRECTION_RESULTS.index)


# --- where a row's interval and the paper's come from ----------------------------------------------------------

def test_the_interval_comes_from_a_sibling_key_or_the_statistic_text(committed_rows):
    corpus = by_key(committed_rows, "R-D18", "corpus_microf1_mistill_minus_bf16_vanilla")
    assert corpus.interval_source == "key" and corpus.interval_key == f"{corpus.key}_interval"
    assert corpus.paper_interval == (-0.007, 0.019) and corpus.paper_text == "+0.006 [-0.007, +0.019]"
    per_note = by_key(committed_rows, "R-D5", "smollm_mistill_vs_bf16_vanilla_per_note")
    assert per_note.interval_source == "statistic"      # "... 95% percentile bootstrap [-0.0808, +0.0246] ..."
    statistic = json.loads((REPO / "results" / "R-D5.json").read_text())["values"][per_note.key]["statistic"]
    low, high = (float(x) for x in re.search(r"bootstrap \[([-+0-9.]+), ([-+0-9.]+)\]", statistic).groups())
    assert per_note.interval == (low, high)
    assert per_note.direction == ("+" if low > 0 else "-" if high < 0 else "0")
    assert per_note.paper_direction == "0" and per_note.agree == (per_note.direction == "0")
    aligned = by_key(committed_rows, "R-D19", "qwen_aligned_subset_gain_vs_fp32")
    assert aligned.interval is None and aligned.paper_value is None and aligned.agree is None


def test_rows_from_hand_written_numbers_files(scratch_root):
    """A fixture of each shape: sibling interval above 0, a quoted interval holding 0, a value without one."""
    results = scratch_root / "results"
    write_fixture(results, "R-D5", {
        **values_of({"qwen_mistill_vs_bf16_vanilla_per_note": -0.004},
                    "mean per-note F1 difference, 95% percentile bootstrap [-0.0120, +0.0050] (1000 resamples)"),
        **values_of({"task_note_pairs_mistill_vs_bf16": 205}, "note-pairs higher")}, profile="demo")
    write_fixture(results, "R-D6", values_of({"qwen_mistill_minus_bf16_vanilla_p2c": -0.02,
                                              "qwen_mistill_vs_bf16_p2c_sign_p": 0.04}), profile="demo")
    write_fixture(results, "R-D18", values_of({"qwen_note_clustered_p2c_gain_vs_bf16": 0.03,
                                               "qwen_note_clustered_p2c_gain_vs_bf16_interval": [0.01, 0.05]}),
                  profile="demo")
    write_fixture(results, "R-D19", values_of({"smollm_aligned_subset_gain_vs_bf16": 0.2}), profile="demo")
    rows = {(row.result_id, row.key): row for row in read_direction_rows(scratch_root, "demo", results)}

    quoted = rows[("R-D5", "qwen_mistill_vs_bf16_vanilla_per_note")]
    assert (quoted.interval, quoted.direction, quoted.paper_direction, quoted.agree) == ((-0.012, 0.005), "0", "0", True)
    assert quoted.value_text == "-0.004 [-0.012, +0.005]"
    bare = rows[("R-D6", "qwen_mistill_minus_bf16_vanilla_p2c")]
    assert (bare.direction, bare.paper_direction, bare.agree) == ("(-)", "(+)", False)   # the paper: +0.027
    sibling = rows[("R-D18", "qwen_note_clustered_p2c_gain_vs_bf16")]
    assert (sibling.direction, sibling.paper_direction, sibling.agree) == ("+", "(+)", True)
    assert rows[("R-D19", "smollm_aligned_subset_gain_vs_bf16")].agree is True            # the paper: +0.334
    assert ("R-D5", "task_note_pairs_mistill_vs_bf16") not in rows
    assert ("R-D6", "qwen_mistill_vs_bf16_p2c_sign_p") not in rows
    # a key the registry knows that this numbers file lacks is a row with nothing to read
    absent = rows[("R-D19", "qwen_aligned_subset_gain_vs_bf16")]
    assert (absent.value_text, absent.direction, absent.agree) == ("?", "?", None)


def test_missing_files_are_clear_errors(scratch_root, tmp_path):
    results = tmp_path / "results"
    for rid in ("R-D5", "R-D6", "R-D18"):
        write_fixture(results, rid, values_of({"qwen_mistill_minus_bf16_vanilla_p2c": 0.01}), profile="demo")
    with pytest.raises(UserError, match=r"no numbers file .*R-D19\.json: run `dvc repro R-D19` first"):
        read_direction_rows(scratch_root, "demo", results)
    write_fixture(results, "R-D19", values_of({"qwen_aligned_subset_gain_vs_bf16": 0.01}), profile="paper")
    with pytest.raises(UserError, match=r"R-D19\.json: written under profile 'paper', reading 'demo'"):
        read_direction_rows(scratch_root, "demo", results)
    (scratch_root / "results" / "expected" / "paper.yaml").unlink()
    with pytest.raises(UserError, match=r"paper\.yaml: no paper expected values"):
        read_direction_rows(scratch_root, "demo", results)


# --- README and the CLI -----------------------------------------------------------------------------------------

def test_readme_holds_the_table_the_committed_results_give(committed_rows):
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 300
    inside = text.split(README_BEGIN, 1)[1].split(README_END, 1)[0]
    assert inside == f"\n{readme_block(committed_rows, 'demo')}\n", \
        "README's direction table is stale: run `mistill repro directions --readme`"
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[headings.index("## Results in brief") + 1] == "## Demo beside paper: Mistill versus Vanilla"
    section = text.split("## Demo beside paper: Mistill versus Vanilla", 1)[1].split("\n## ", 1)[0]
    assert README_BEGIN in section and README_END in section
    table = [line for line in inside.splitlines() if line.startswith("| R-")]
    assert len(table) == len(committed_rows) == len({(r.result_id, r.key) for r in committed_rows})


def test_cli_prints_the_table_and_rewrites_a_readme(tmp_path, monkeypatch, capsys, committed_rows):
    monkeypatch.chdir(REPO)
    args = ["repro", "directions", "--profile", "demo", "--results", str(REPO / "results")]
    assert main([*args, "--markdown"]) == 0
    assert capsys.readouterr().out == readme_block(committed_rows, "demo") + "\n"
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{README_BEGIN}\nold table\n{README_END}\noutro\n")
    assert main([*args, "--readme", str(readme)]) == 0
    assert readme.read_text() == f"intro\n{README_BEGIN}\n{readme_block(committed_rows, 'demo')}\n{README_END}\noutro\n"
    assert main([*args, "--results", str(tmp_path / "none")]) == 2
    assert "no numbers file" in capsys.readouterr().err


# --- the rendered table ----------------------------------------------------------------------------------------

def render_directions(registry, results, out, tmp_path, strict):
    templates = templates_with(tmp_path / "templates", ["directions"])
    return render_paper(registry, results_dir=results, out_dir=out, templates_dir=templates, profile="demo",
                        strict=strict)


def test_the_template_renders_the_same_rows(registry, committed_rows, tmp_path):
    report = render_directions(registry, REPO / "results", tmp_path / "build", tmp_path, strict=True)
    assert "tables/directions.md" not in report.missing
    md = (tmp_path / "build" / "tables" / "directions.md").read_text()
    rendered = [md_cells(line) for line in md.splitlines() if line.startswith("| R-")]
    assert rendered == [[row.result_id, row.key, row.value_text, row.direction, row.paper_text, row.paper_direction,
                         row.agree_text] for row in committed_rows]
    assert md_cells(next(line for line in md.splitlines() if line.startswith("| Result")))[2] == "demo [95% interval]"
    assert readme_block(committed_rows, "demo").splitlines()[0] in md          # the agreement summary, as a note
    tex = (tmp_path / "build" / "tables" / "directions.tex").read_text()
    corpus = by_key(committed_rows, "R-D18", "corpus_microf1_mistill_minus_bf16_vanilla")
    assert rf"R-D18 & corpus\_microf1\_mistill\_minus\_bf16\_vanilla & {corpus.value_text} & {corpus.direction} &" in tex


def test_a_missing_numbers_file_shows_question_marks_in_its_rows(registry, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    for rid in ("R-D5", "R-D6", "R-D18"):
        shutil.copy(REPO / "results" / f"{rid}.json", results / f"{rid}.json")
    report = render_directions(registry, results, tmp_path / "build", tmp_path, strict=False)
    md = (tmp_path / "build" / "tables" / "directions.md").read_text()
    r_d19 = [md_cells(line) for line in md.splitlines() if line.startswith("| R-D19 |")]
    assert r_d19 and all(cells[2] == MISSING for cells in r_d19)
    assert "R-D19.smollm_aligned_subset_gain_vs_bf16" in report.missing["tables/directions.md"]
    assert "R-D19.smollm_aligned_subset_gain_vs_bf16" in report.claimed        # the demo claims it
    with pytest.raises(UserError, match=r"strict: profile demo claims numbers .* R-D19 \(no numbers file;"):
        render_directions(registry, results, tmp_path / "strict", tmp_path, strict=True)
