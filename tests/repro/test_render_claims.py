"""Strict rendering is scoped to what the active profile claims: its required statuses' results, its keys."""

import json

import pytest

from mistill.cli import main
from mistill.errors import UserError
from mistill.repro.render import MISSING, claimed_numbers, render_paper
from tests.repro.repro_helpers import REPO, minus_sign, write_fixture

TEMPLATES = REPO / "paper" / "templates"


@pytest.fixture
def demo_results(registry, tmp_path):
    """A numbers file for every result the demo profile claims (status demo), at its demo expected values."""
    d = tmp_path / "results"
    for rid, keys in registry.expected("demo").values.items():
        assert registry.results[rid].status == "demo"
        write_fixture(d, rid, {key: {"value": exp.value, "statistic": exp.stat, "artifact": "fixture"}
                               for key, exp in keys.items()}, profile="demo")
    return d


def render(registry, results, out, strict):
    return render_paper(registry, results_dir=results, out_dir=out, templates_dir=TEMPLATES, profile="demo",
                        strict=strict)


def md_row(text, label):
    return next(line for line in text.splitlines() if line.startswith(f"| {label} |")).split(" | ")


def test_the_demo_claims_its_demo_results_and_their_demo_keys(registry):
    claims = claimed_numbers(registry, "demo")
    assert sorted(claims) == ["R-C1", "R-C10", "R-C11", "R-C12", "R-C13", "R-C14", "R-C15", "R-C2", "R-C3", "R-C4", "R-C5", "R-C6", "R-C7", "R-C8",
                              "R-C9", "R-D0", "R-D1", "R-D10", "R-D11", "R-D12", "R-D13", "R-D14", "R-D15", "R-D16", "R-D17", "R-D18", "R-D19", "R-D2", "R-D20", "R-D21", "R-D22", "R-D23", "R-D24", "R-D25", "R-D26", "R-D27", "R-D28", "R-D29", "R-D3", "R-D30", "R-D31", "R-D32", "R-D33", "R-D34",
                              "R-D35", "R-D36", "R-D4", "R-D5",
                              "R-D6", "R-D7", "R-D8", "R-D9"]
    assert list(claims["R-C3"]) == list(registry.expected("demo").values["R-C3"])
    assert "knockin_top40_p1" not in claims["R-C3"]          # a paper-only key of a demo result
    paper = claimed_numbers(registry, "paper")
    assert "R-C9" in paper and "R-D37" in paper and "R-D37" not in claims   # status paper: claimed by paper only


def test_strict_passes_when_every_claimed_number_is_present(registry, demo_results, tmp_path):
    report = render(registry, demo_results, tmp_path / "build", strict=True)
    assert report.claimed == set()
    shown = report.shown_missing()
    assert "R-C3.knockin_top40_p1" in shown and "R-D33.secondary_delta_d_fp32" not in shown   # the fp32 secondary pair runs
    # the demo trains the paper's three seeds: its per-seed cells show every one
    assert not any(label.startswith("R-D6.smollm_fp32_vanilla_own_p2c_seeds") for label in shown)
    assert report.summary() == (f"profile demo: ?? for {len(shown)} number(s), 0 of them claimed by the profile, "
                                f"{len(shown)} not claimed (results, keys or seeds it does not produce)")
    t1 = (tmp_path / "build" / "tables" / "table1.md").read_text()
    c3 = registry.expected("demo").values["R-C3"]   # demo values of keys the demo claims, as the table rounds them
    cells = [f"{c3[f'necessity_top8_{p}'].value:.2f}" for p in ("p1", "p2", "p2c")]
    assert md_row(t1, "top-8")[1:] == [*cells[:2], f"{cells[2]} |"]
    assert md_row(t1, "top-40")[1:] == [MISSING, MISSING, f"{MISSING} |"]  # the paper's k=40 is not the demo's


def test_strict_names_the_result_and_keys_of_a_missing_claimed_number(registry, demo_results, tmp_path):
    (demo_results / "R-C2.json").unlink()
    with pytest.raises(UserError) as err:
        render(registry, demo_results, tmp_path / "build", strict=True)
    assert not (tmp_path / "build").exists()
    # Without --strict the same gap renders as ?? and is counted as claimed: every demo key of R-C2, a list
    # value's elements one by one where a table shows them so
    report = render(registry, demo_results, tmp_path / "build", strict=False)
    claimed = sorted(report.claimed)
    assert {label.split("[")[0] for label in claimed} == {f"R-C2.{key}" for key in registry.expected("demo").values["R-C2"]}
    assert f"{len(claimed)} of them claimed by the profile" in report.summary()
    assert str(err.value) == (
        "strict: profile demo claims numbers that no numbers file holds: R-C2 (no numbers file; "
        f"{len(claimed)} value(s): all_heads_knockin_minus_clean_margin, all_heads_knockin_minus_clean_max_abs, "
        "attr_vs_exact_corr_detached_above_noise, ...) (run their stages, or render without --strict)")


def test_strict_names_a_claimed_key_missing_from_a_present_file(registry, demo_results, tmp_path):
    values = {key: {"value": exp.value, "statistic": exp.stat, "artifact": "fixture"}
              for key, exp in registry.expected("demo").values["R-C3"].items() if key != "necessity_top8_p1"}
    write_fixture(demo_results, "R-C3", values, profile="demo")
    with pytest.raises(UserError, match=r"claims numbers that no numbers file holds: R-C3 \(1 value\(s\): "
                                        r"necessity_top8_p1\)"):
        render(registry, demo_results, tmp_path / "build", strict=True)


def test_cli_strict_passes_and_prints_the_summary_then_fails_naming_r_c2(demo_results, tmp_path, monkeypatch,
                                                                         capsys):
    monkeypatch.chdir(REPO)
    args = ["repro", "render", "--strict", "--profile", "demo", "--results", str(demo_results),
            "--out", str(tmp_path / "build")]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "0 of them claimed by the profile" in err and "?? for" not in err.split("profile demo:")[0]
    templates = len(list((TEMPLATES / "tables").glob("table*.j2")))
    assert templates == 48                    # Tables 1-11, 13-27, 29-33, 35-39, 41, 43-46, 49, 51-55, K sweep
    templates += 1                            # and the Mistill-versus-Vanilla direction table (directions.j2)
    assert out.startswith(f"wrote {2 * templates + 1} files under")   # each as .tex and .md, and macros.tex
    assert "tables: 47 of the paper's 59 captioned tables have a template (49 templates in all)" in err
    (demo_results / "R-C2.json").unlink()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "R-C2 (no numbers file;" in err and "all_heads_knockin_minus_clean_margin" in err


def test_rows_name_the_profiles_own_models(registry, demo_results, tmp_path, monkeypatch):
    """params labels.models names each model in the tables: the demo's tiny students are not Qwen3-4B."""
    render(registry, demo_results, tmp_path / "build", strict=False)
    tables = {n: (tmp_path / "build" / "tables" / f"{n}.md").read_text() for n in ("table2", "table3", "table43")}
    for text in tables.values():
        assert "Qwen3-4B" not in text and "SmolLM3-3B" not in text and "Qwen3-14B" not in text
        assert "***demo Qwen3 student***" in text and "***demo SmolLM3 student***" in text
    p2c = registry.expected("demo").values["R-D6"]["teacher_hd002_p2c_k40"].value
    assert md_row(tables["table3"], "teacher (demo Qwen3 teacher, HD-002)")[3] == minus_sign(f"{p2c:.3f}")
    figures = (tmp_path / "build" / "figures" / "index.md").read_text()   # figure titles name them too
    assert "## Figure 6: phases, terms and dose (demo Qwen3 student)" in figures and "Qwen3-4B" not in figures

    import mistill.params

    # a profile whose labels miss a model a table names
    monkeypatch.setattr(mistill.params, "load_params", lambda *a, **k: {"labels": {"models": {"teacher": "T"}},
                                                                     "distill": {"seeds": [0]}})
    with pytest.raises(UserError, match=r"profile demo: params labels.models names no 'student_qwen' \(it names: teacher\)"):
        render(registry, demo_results, tmp_path / "again", strict=False)


def test_table3_shows_every_row_the_demo_computed(registry, tmp_path):
    """After `dvc repro R-D6` (the committed numbers files), Table 3 has no ?? in a row the demo trains, the fp32 arms
    at both lambdas (R-D17, R-D30) included."""
    render(registry, REPO / "results", tmp_path / "build", strict=True)
    rows = [line for line in (tmp_path / "build" / "tables" / "table3.md").read_text().splitlines()
            if line.startswith("| ") and not line.startswith("| ***") and not line.startswith("| Arm")]
    gaps = [line.split(" | ")[0][2:] for line in rows if MISSING in line]
    assert gaps == []
    assert len(rows) == 12
    mistill = next(line for line in rows if line.startswith("| Mistill, seeds"))
    numbers = json.loads((REPO / "results" / "R-D6.json").read_text())["values"]
    assert mistill.split(" | ")[3] == " / ".join(minus_sign(f"{x:.3f}") for x in numbers["qwen_mistill_own_p2c_seeds"]["value"])
