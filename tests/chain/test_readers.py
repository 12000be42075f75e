"""The R-D1 / R-D2 / R-D5 readers on hand-made DT-eval artifacts, against hand-worked values."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

from mistill.evaluate.task import task_metrics
from mistill.io import write_json, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "readers"))

import r_d1  # noqa: E402
import r_d2  # noqa: E402
import r_d5  # noqa: E402

GOLD = {"n1": ["A00.0", "B00.0"], "n2": ["C00.0"], "n3": ["D00.0", "E00.0"], "n4": ["F00.0"]}
TRAIN_GOLD = [["A00.0"], ["C00.0", "D00.0"], ["F00.0"]]
ARMS = {"qwen_untrained": "student-qwen-untrained", "qwen_vanilla_fp32": "student-qwen-vanilla-fp32",
        "qwen_vanilla_bf16": "student-qwen-vanilla-bf16", "qwen_mistill": "student-qwen-mistill-bf16",
        "smollm_untrained": "student-smol-untrained"}


def note_f1(pred, gold):
    tp = len(set(pred) & set(gold))
    return 0.0 if tp == 0 else 2 * tp / (len(set(pred)) + len(set(gold)))


def write_arm(root: Path, label: str, seed: int, preds: dict, m1_shares: dict | None = None) -> None:
    """preds: note -> answer list, or None for an invalid generation (one that ran to the 1,024-token cap; a valid
    one generated 100 tokens per code)."""
    d = root / "DT-eval" / f"{label}-s{seed}"
    rows = [{"note_id": n, "valid": p is not None, "answer": p or [], "completion": "", "prompt": "",
             "hit_cap": p is None, "n_new_tokens": 1024 if p is None else 100 * len(p)} for n, p in preds.items()]
    write_jsonl(d / "generations.jsonl", rows)
    notes = list(GOLD)
    metrics = task_metrics([preds[n] or [] for n in notes], [GOLD[n] for n in notes],
                           [preds[n] is not None for n in notes], TRAIN_GOLD)
    write_json(d / "task.json", {"metrics": metrics})
    if m1_shares is not None:
        write_json(d / "m1.json", {"m1": {k: {"p_margin_positive": v["pooled"], "events": 10, "median_margin": 0.25,
                                              "per_note_share": v["per_note"]} for k, v in m1_shares.items()}})


@pytest.fixture()
def world(tmp_path):
    write_jsonl(tmp_path / "dt_test.jsonl", [{"note_id": n, "patient_id": f"p{n}", "text": "x", "gold_codes": g,
                                              "split": "test"} for n, g in GOLD.items()])
    # teacher: perfect on n1, n2, n3; n4 invalid
    write_jsonl(tmp_path / "teacher.jsonl", [{"note_id": n, "valid": n != "n4", "answer": GOLD[n]} for n in GOLD])
    art = tmp_path / "artifacts"
    write_arm(art, ARMS["qwen_untrained"], 0, {"n1": ["A00.0"], "n2": None, "n3": ["X00.0"], "n4": None},
              {k: {"pooled": 0.5, "per_note": {"n1": 0.5}} for k in ("P1", "P2", "P2C")})
    write_arm(art, ARMS["smollm_untrained"], 0, {"n1": None, "n2": None, "n3": None, "n4": None})
    write_arm(art, ARMS["qwen_vanilla_fp32"], 0, {"n1": ["A00.0", "B00.0"], "n2": ["C00.0"], "n3": None, "n4": None},
              {k: {"pooled": 0.7, "per_note": {"n1": 0.7}} for k in ("P1", "P2", "P2C")})
    write_arm(art, ARMS["qwen_vanilla_fp32"], 1, {"n1": ["A00.0"], "n2": ["C00.0"], "n3": ["D00.0"], "n4": None})
    m1_van = {"P1": {"pooled": 0.6, "per_note": {"n1": 0.5, "n2": 1.0, "n3": 0.5}},
              "P2": {"pooled": 0.6, "per_note": {"n1": 0.5}},
              "P2C": {"pooled": 0.6, "per_note": {"n1": 0.5, "n2": 1.0, "n3": 0.5}}}
    m1_mis = {"P1": {"pooled": 0.6, "per_note": {"n1": 0.5, "n2": 0.5, "n3": 0.5}},
              "P2": {"pooled": 0.6, "per_note": {"n1": 0.5}},
              "P2C": {"pooled": 0.8, "per_note": {"n1": 1.0, "n2": 0.5, "n3": 1.0}}}
    write_arm(art, ARMS["qwen_vanilla_bf16"], 0, {"n1": ["A00.0"], "n2": None, "n3": ["D00.0"], "n4": ["F00.0"]},
              m1_van)
    write_arm(art, ARMS["qwen_mistill"], 0, {"n1": ["A00.0", "B00.0"], "n2": None, "n3": ["D00.0"], "n4": None},
              m1_mis)
    return {"profile": "demo", "paths": {"artifacts": str(art), "results": str(tmp_path / "results")},
            "evaluate": {"test_notes": str(tmp_path / "dt_test.jsonl"), "teacher_traces": str(tmp_path / "teacher.jsonl"),
                         "own_heads": {"arms": ARMS}},
            "stats": {"bootstrap_resamples": 200, "bootstrap_seed": 0, "confidence": 0.95}}


def test_r_d1_values(world):
    v, inputs = r_d1.compute_values(world)
    # untrained qwen: tp 1 (A00.0), fp 1 (X00.0), fn 5 -> micro-F1 2/(2+1+5)
    assert v["qwen3_4b_untrained_microf1"]["value"] == pytest.approx(2 / 8)
    assert v["qwen3_4b_untrained_valid_rate"]["value"] == pytest.approx(0.5)
    assert v["qwen3_4b_untrained_m1_p1_p2_p2c"]["value"] == [0.5, 0.5, 0.5]
    assert v["smollm3_3b_untrained_microf1"]["value"] == 0.0
    assert "smollm3_3b_untrained_m1_p1_p2_p2c" not in v  # no m1.json: no value, not a made-up one
    # two of four generations ran to the cap; tokens (100 + 1024 + 100 + 1024) / 4
    assert v["qwen3_4b_untrained_cap_share"]["value"] == 0.5
    assert v["qwen3_4b_untrained_mean_new_tokens"]["value"] == pytest.approx(562.0)
    assert v["smollm3_3b_untrained_cap_share"]["value"] == 1.0
    assert inputs


def test_r_d2_values(world):
    v, _ = r_d2.compute_values(world)
    s0 = 2 * 3 / (2 * 3 + 0 + 3)  # tp 3, fp 0, fn 3
    s1 = 2 * 3 / (2 * 3 + 0 + 3)
    assert v["qwen_vanilla_fp32_microf1_seeds"]["value"] == pytest.approx([s0, s1])
    assert v["qwen_vanilla_fp32_microf1_sd"]["value"] == pytest.approx(statistics.stdev([s0, s1]))
    assert "2 seeds (0, 1)" in v["qwen_vanilla_fp32_microf1"]["statistic"]
    base, teacher = 2 / 8, 2 * 5 / (2 * 5 + 0 + 1)
    assert v["qwen_vanilla_gap_recovered"]["value"] == pytest.approx(((s0 + s1) / 2 - base) / (teacher - base))
    # per note: arm F1 averaged over seeds, minus the untrained F1
    arm = {"n1": (1.0 + note_f1(["A00.0"], GOLD["n1"])) / 2, "n2": 1.0, "n3": (0 + note_f1(["D00.0"], GOLD["n3"])) / 2,
           "n4": 0.0}
    untrained = {"n1": note_f1(["A00.0"], GOLD["n1"]), "n2": 0.0, "n3": 0.0, "n4": 0.0}
    expected = sum(arm[n] - untrained[n] for n in GOLD) / 4
    assert v["qwen_vanilla_minus_untrained"]["value"] == pytest.approx(expected)
    assert "percentile bootstrap" in v["qwen_vanilla_minus_untrained"]["statistic"]
    # completed answers of seed 0: n1, n2 valid -> tp 3, fp 0, fn 0
    assert v["qwen_vanilla_fp32_completed_precision_recall"]["value"] == pytest.approx([1.0, 1.0])
    assert v["qwen_vanilla_fp32_m1_p1_p2c"]["value"] == [0.7, 0.7]
    # cap share and tokens: each seed's mean over notes, then the mean over seeds
    assert v["qwen_vanilla_fp32_cap_share"]["value"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert v["qwen_vanilla_fp32_mean_new_tokens"]["value"] == pytest.approx(
        ((200 + 100 + 1024 + 1024) / 4 + (100 + 100 + 100 + 1024) / 4) / 2)
    assert "mean over 2 seeds (0, 1)" in v["qwen_vanilla_fp32_cap_share"]["statistic"]


def test_r_d5_values(world):
    v, _ = r_d5.compute_values(world)
    mis = [note_f1(["A00.0", "B00.0"], GOLD["n1"]), 0.0, note_f1(["D00.0"], GOLD["n3"]), 0.0]
    van = [note_f1(["A00.0"], GOLD["n1"]), 0.0, note_f1(["D00.0"], GOLD["n3"]), 1.0]
    assert v["qwen_mistill_vs_bf16_vanilla_per_note"]["value"] == pytest.approx(sum(mis) / 4 - sum(van) / 4)
    assert v["task_note_pairs_mistill_vs_bf16"]["value"] == 1  # n1 higher, n4 lower, n2 n3 tied
    assert "1 higher, 1 lower, 2 ties of 4" in v["task_note_pairs_mistill_vs_bf16"]["statistic"]
    assert v["m1_p2c_note_pairs_mistill_higher"]["value"] == 2  # n1, n3
    assert v["m1_p2c_pooled_mean_diff_vs_bf16"]["value"] == pytest.approx((0.5 - 0.5 + 0.5) / 3)
    assert v["m1_p1_pooled_mean_diff_vs_bf16"]["value"] == pytest.approx(-0.5 / 3)
    assert v["m1_p2c_mistill"]["value"] == pytest.approx(0.8)
    assert v["m1_p2c_bf16_vanilla"]["value"] == pytest.approx(0.6)
    assert "qwen_mistill_microf1_sd" not in v  # one seed: no s.d.
    assert v["qwen_mistill_seed0_m1_p1_p2_p2c"]["value"] == [0.6, 0.6, 0.8]
    assert v["qwen_mistill_microf1_seeds"]["value"] == pytest.approx([v["qwen_mistill_microf1"]["value"]])
    assert v["qwen_vanilla_bf16_valid_rate"]["value"] == 0.75
    assert v["qwen_vanilla_bf16_cap_share"]["value"] == 0.25
    assert v["qwen_mistill_mean_new_tokens"]["value"] == pytest.approx((200 + 1024 + 100 + 1024) / 4)


def test_numbers_file_keeps_registered_keys(world, capsys):
    v, inputs = r_d1.compute_values(world)
    v["qwen3_4b_untrained_not_a_key"] = dict(v["qwen3_4b_untrained_microf1"])
    assert r_d1.write("R-D1", "readers/r_d1.py", v, inputs, world, r_d1.keys(world)) == 0
    out = json.loads((Path(world["paths"]["results"]) / "R-D1.json").read_text())
    keys = set(out["values"]) if "values" in out else set(out)
    assert {"qwen3_4b_untrained_microf1", "qwen3_4b_untrained_m1_p1_p2_p2c"} <= keys  # the latter an extra key
    assert "qwen3_4b_untrained_not_a_key" not in keys
    assert "qwen3_4b_untrained_not_a_key" in capsys.readouterr().err  # not registered: named, left out


def test_missing_generation_is_a_user_error(world):
    from mistill.errors import UserError

    gen = Path(world["paths"]["artifacts"]) / "DT-eval" / "student-qwen-untrained-s0" / "generations.jsonl"
    gen.write_text(gen.read_text().splitlines()[0] + "\n")
    with pytest.raises(UserError, match="no generation for 3 test notes"):
        r_d1.compute_values(world)
