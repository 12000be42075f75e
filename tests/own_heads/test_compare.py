"""Seed-matched, note-clustered comparisons against scipy and mistill.stats on hand-made examples;
per-note recovery by hand; the compare command and the R-D6 reader on hand-made M6 artifacts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from mistill.errors import UserError
from mistill.evaluate import compare as cmp
from mistill.evaluate import own_heads_commands
from mistill.io import write_json, write_jsonl
from mistill.repro.reader_module import load_reader
from mistill.stats import StatsParams, bootstrap_mean

REPO = Path(__file__).resolve().parents[2]
STATS = StatsParams(bootstrap_resamples=500, bootstrap_seed=3)


def test_clustered_comparison_agrees_with_scipy():
    notes = [f"n{i}" for i in range(12)]
    rng = np.random.default_rng(0)
    arm = {s: dict(zip(notes, rng.normal(0.6, 0.1, 12).round(3))) for s in (0, 1, 2)}
    ref = {s: dict(zip(notes, rng.normal(0.5, 0.1, 12).round(3))) for s in (0, 1, 2)}
    arm[1].pop("n11")  # a note missing from one seed leaves every comparison
    out = cmp.clustered(arm, ref, STATS)
    kept = sorted(notes[:11])
    d = np.mean([[arm[s][n] - ref[s][n] for n in kept] for s in (0, 1, 2)], axis=0)  # seed i vs seed i
    assert out["notes"] == kept and out["n_notes"] == 11
    np.testing.assert_allclose(list(out["per_note_difference"].values()), d)
    assert out["mean_difference"] == pytest.approx(d.mean())
    assert out["median_difference"] == pytest.approx(np.median(d))
    higher, lower = int((d > 0).sum()), int((d < 0).sum())
    assert (out["notes_higher"], out["notes_lower"]) == (higher, lower)
    assert out["sign_p"] == pytest.approx(sps.binomtest(higher, higher + lower, 0.5).pvalue)
    w = sps.wilcoxon(d, zero_method="wilcox", alternative="two-sided")
    assert out["wilcoxon_p"] == pytest.approx(w.pvalue) and out["wilcoxon_statistic"] == pytest.approx(w.statistic)
    iv = bootstrap_mean(d, n_resamples=500, seed=3)
    assert (out["ci_low"], out["ci_high"]) == pytest.approx((iv.low, iv.high))
    pairs = np.array([[arm[s][n] - ref[s][n] for n in kept] for s in (0, 1, 2)])
    assert out["pooled_note_pairs"]["n"] == 33 and out["pooled_note_pairs"]["higher"] == int((pairs > 0).sum())


def test_one_seed_reference_pairs_with_every_seed():
    arm = {0: {"a": 1.0, "b": 0.0}, 1: {"a": 3.0, "b": 1.0}}
    ref = {7: {"a": 1.0, "b": 1.0}}
    out = cmp.clustered(arm, ref, STATS)
    assert out["per_note_difference"] == {"a": 1.0, "b": -0.5}  # ((1-1) + (3-1)) / 2, ((0-1) + (1-1)) / 2
    assert [(p["arm_seed"], p["reference_seed"]) for p in out["seed_pairs"]] == [(0, 7), (1, 7)]
    assert cmp.clustered(arm, {0: {}}, STATS) is None


def _row(kind, corr, all_, top, rnd, k=4):
    return {"kind": kind, "pos": 1, "margin_clean": all_, "margin_corr": corr, "margin_all": all_,
            "knockin": {"top": {str(k): top}, "random": {str(k): rnd}}}


def test_note_recovery_by_hand():
    rows = {"a": [_row("P2C", 0.0, 2.0, 1.5, 0.2), _row("P2C", 1.0, 3.0, 2.0, 1.0),
                  _row("P2C", 0.0, 0.5, 0.5, 0.0)],   # gap 0.5 < 1 nat: gated out
            "b": [_row("P2C", -1.0, 1.0, 1.0, 0.0), _row("P1", 0.0, 4.0, 1.0, 0.0)],
            "c": [_row("P2C", 0.0, 0.2, 0.2, 0.0)]}   # no gated event: no value
    got = cmp.note_recovery(rows, phase="P2C", set_kind="top", k=4)
    assert got == pytest.approx({"a": (0.75 + 0.5) / 2, "b": 1.0})
    assert cmp.note_recovery(rows, phase="P2C", set_kind="random", k=4) == pytest.approx({"a": 0.05, "b": 0.5})
    assert cmp.note_recovery(rows, phase="P2", set_kind="top", k=4) == {}


def write_m6(root: Path, label: str, seed: int, values: dict[str, float], lift: dict[str, float], k: int = 4,
             top_panel: dict | None = None):
    """A hand-made M6 directory: one gated P2C and P2 event per note with recovery `values[note]`, one P1 event
    per note with recovery 0.9; `top_panel`: the own top read-side panel's summary at every phase."""
    m6 = root / "M6" / f"{label}-s{seed}"
    for note, v in values.items():
        write_jsonl(m6 / note / "patch2.jsonl", [_row(kind, 0.0, 2.0, 2.0 * v, 0.2, k) for kind in ("P2C", "P2")]
                    + [_row("P1", 0.0, 2.0, 1.8, 0.1, k)])
    write_json(m6 / "faithfulness2.json", {"notes": list(values), "bins": [k], "phases": {
        "P1": {"all_heads_minus_clean_max_abs": 2e-6}, "P2C": {"all_heads_minus_clean_max_abs": 1e-5 * (seed + 1)}}})
    per_note = {n: {"lift": x} for n, x in lift.items()}
    write_json(m6 / "readside.json", {"phases": {p: {"per_note": {"top": per_note, "random": per_note},
                                                     "top": top_panel or {}} for p in ("P1", "P2C")}})


@pytest.fixture
def arms(tmp_path):
    notes = [f"n{i}" for i in range(8)]
    rng = np.random.default_rng(1)
    for label, center in (("q-mistill", 0.7), ("q-vanilla", 0.5), ("q-untrained", 0.4)):
        for seed in ((0,) if label == "q-untrained" else (0, 1)):
            write_m6(tmp_path, label, seed, dict(zip(notes, rng.uniform(center - 0.1, center + 0.1, 8))),
                     dict(zip(notes, rng.uniform(center, center + 1, 8))))
    return tmp_path


def test_compare_arms_reads_the_chain_artifacts(arms):
    out = cmp.compare_arms(arms, "q-mistill", "q-vanilla", k=4, stats=STATS)
    a = cmp.arm_values(arms, "q-mistill", "m4", phase="P2C", k=4)
    r = cmp.arm_values(arms, "q-vanilla", "m4", phase="P2C", k=4)
    assert set(a) == {0, 1} and len(a[0]) == 8
    assert out["m4"]["P2C"]["comparison"] == cmp.clustered(a, r, STATS)
    assert out["m4"]["P2C"]["arm"]["per_seed_median"][0] == pytest.approx(np.median(list(a[0].values())))
    assert out["m4"]["P2C"]["comparison"]["notes_higher"] == 8  # Mistill's values sit above Vanilla's
    assert out["m4"]["P1"]["comparison"]["mean_difference"] == pytest.approx(0.0)
    assert out["m2"]["P2C"]["comparison"]["n_notes"] == 8
    with pytest.raises(UserError, match="no M6/nope-s"):
        cmp.seed_dirs(arms, "nope")


def _params(root: Path) -> dict:
    return {"profile": "demo", "paths": {"artifacts": str(root), "results": str(root / "results")},
            "instrument": {"knockin": {"min_range": 1.0}},
            "evaluate": {"test_notes": "unused", "own_heads": {
                "validation_traces": "u", "validation_events_dir": "u", "test_traces": "u", "test_events_dir": "u",
                "bins": [2, 4], "readside_k": 4, "teacher_k": 8,
                "teacher_faithfulness": str(root / "HD-002" / "faithfulness2.json"),
                "arms": {"qwen_untrained": "q-untrained", "qwen_vanilla_fp32": "q-vanilla", "qwen_mistill": "q-mistill",
                         "smollm_untrained": "absent"}}},
            "stats": {"bootstrap_resamples": 500, "bootstrap_seed": 3}}


def test_compare_command_writes_its_json(arms, monkeypatch, capsys):
    monkeypatch.setattr(own_heads_commands, "_params", lambda: _params(arms))
    parser = argparse.ArgumentParser()
    own_heads_commands.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["compare", "--arm", "q-mistill", "--reference", "q-vanilla"])
    assert args.func(args) == 0
    body = json.loads((arms / "M6-compare" / "q-mistill__vs__q-vanilla.json").read_text())
    assert body["k"] == 4 and body["m4"]["P2C"]["comparison"]["notes_higher"] == 8
    assert "provenance" in body and "M4 P2C k=4" in capsys.readouterr().out
    args = parser.parse_args(["compare", "--arm", "q-mistill", "--reference", "q-vanilla", "--k", "3"])
    with pytest.raises(UserError, match="--k 3"):
        args.func(args)


def test_reader_values_and_numbers_file(arms, monkeypatch):
    reader = load_reader(REPO / "readers" / "r_d6.py")
    write_json(arms / "HD-002" / "faithfulness2.json",
               {"phases": {"P2C": {"bins": {"8": {"knockin": {"top": {"median": 0.8}}}}}}})
    params = _params(arms)
    values, inputs = reader.compute_values(params)
    untrained = cmp.seed_medians(cmp.arm_values(arms, "q-untrained", "m4", phase="P2C", k=4))
    assert values["untrained_qwen_own_p2c_k40"]["value"] == pytest.approx(untrained["mean_of_seed_medians"])
    assert values["qwen_untrained_random40_floors_p1_p2c"]["value"] == pytest.approx([0.05, 0.1])
    assert values["teacher_hd002_p2c_k40"]["value"] == 0.8
    assert values["untrained_qwen_share_of_teacher"]["value"] == pytest.approx(
        100 * untrained["mean_of_seed_medians"] / 0.8)
    c = cmp.clustered(cmp.arm_values(arms, "q-mistill", "m4", phase="P2C", k=4),
                      cmp.arm_values(arms, "q-vanilla", "m4", phase="P2C", k=4), cmp.StatsParams(500, 10000, 3))
    assert values["qwen_mistill_minus_fp32_vanilla_p2c"]["value"] == pytest.approx(c["mean_difference"])
    assert "qwen_m2_mistill_minus_fp32_vanilla_p1" in values and "qwen_mistill_minus_fp32_vanilla_p2" in values
    assert not any(k.startswith("smollm") for k in values)  # no SmolLM3 arm present: no SmolLM3 key
    seeds = max(len(cmp.seed_dirs(arms, a)) for a in ("q-untrained", "q-vanilla", "q-mistill"))
    assert values["own_all_heads_knockin_minus_clean_max_abs"]["value"] == pytest.approx(1e-5 * seeds)
    from mistill.repro.numbers import read_numbers, write_numbers

    monkeypatch.chdir(REPO)
    path = write_numbers("R-D6", values, reader="readers/r_d6.py", inputs=inputs, params=params,
                         results_dir=arms / "results", declared_keys=reader.keys(params))
    assert read_numbers(path).values["teacher_hd002_p2c_k40"]["value"] == 0.8


def test_reader_writes_table3_cells_of_every_arm_row_and_seed(tmp_path):
    """Per-seed medians over notes per phase, the P2C read-side panel per seed and their means, by hand."""
    reader = load_reader(REPO / "readers" / "r_d6.py")
    notes = [f"n{i}" for i in range(5)]
    for seed, recovery, panel in ((0, [0.1, 0.2, 0.3, 0.4, 0.5], {"lift": 1.4, "share_prefix": 0.02}),
                                  (1, [0.9, 0.5, 0.6, 0.8, 0.7], {"lift": 1.6, "share_prefix": 0.04})):
        write_m6(tmp_path, "q-mistill", seed, dict(zip(notes, recovery)), dict.fromkeys(notes, 1.0), top_panel=panel)
    write_json(tmp_path / "HD-002" / "faithfulness2.json", {"phases": {
        phase: {"bins": {"8": {"knockin": {"top": {"median": median}}}}}
        for phase, median in (("P1", 0.95), ("P2", 0.6), ("P2C", 0.8))}})
    params = _params(tmp_path)
    params["evaluate"]["own_heads"]["arms"] = {"qwen_mistill": "q-mistill"}
    values, _ = reader.compute_values(params)
    got = {key: np.atleast_1d(values[key]["value"]).tolist() for key in reader.row_keys("qwen_mistill")}
    expected = {
        "qwen_mistill_own_p1_seeds": [0.9, 0.9], "qwen_mistill_own_p2_seeds": [0.3, 0.7],
        "qwen_mistill_own_p2c_seeds": [0.3, 0.7], "qwen_mistill_m2_lift_p2c_seeds": [1.4, 1.6],
        "qwen_mistill_prefix_share_p2c_seeds": [0.02, 0.04], "qwen_mistill_own_p2c_seed_mean": [0.5],
        "qwen_mistill_m2_lift_p2c_seed_mean": [1.5], "qwen_mistill_prefix_share_p2c_seed_mean": [0.03]}
    assert got.keys() == expected.keys()
    for key, cells in expected.items():
        assert got[key] == pytest.approx(cells), key
    assert [values[f"teacher_hd002_{p}_k40"]["value"] for p in ("p1", "p2", "p2c")] == [0.95, 0.6, 0.8]
    assert "seeds [0, 1]" in values["qwen_mistill_own_p2c_seeds"]["statistic"]
    assert set(values) <= set(reader.keys(params))
