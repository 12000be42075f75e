"""R-D28's reader on hand-made edit rows: per-note effects on shared events, seed-matched and note-clustered."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mistill.io import write_json, write_jsonl
from mistill.repro.reader_module import load_reader

REPO = Path(__file__).resolve().parents[2]
ARMS = {"qwen_mistill": "student-qwen-mistill-bf16", "qwen_vanilla_bf16": "student-qwen-vanilla-bf16"}


def reader():
    return load_reader(REPO / "readers" / "r_d28.py")


def _row(pos, identity, filler, unrelated, other, ablated=None):
    margins = {"filler": filler, "unrelated": unrelated, "other_category": other}
    return {"pos": pos, "code": "N18.4", "near_miss": "N18.3", "edit_start": 1, "edit_end": 3,
            "margin_identity": identity, "margin": margins,
            "margin_identity_ablated": identity if ablated is None else ablated[0],
            "margin_ablated": {k: (v if ablated is None else ablated[1]) for k, v in margins.items()},
            "replacement": {}}


def _write_arm(root: Path, label: str, seed: int, rows_by_note: dict[str, list[dict]]) -> None:
    edits = root / "M6-edits" / f"{label}-s{seed}"
    for note, rows in rows_by_note.items():
        write_jsonl(edits / note / "prefix_edit.jsonl", rows)
    write_json(edits / "prefix_edit.json", {"notes": list(rows_by_note), "mediation_heads": ["l0h0", "l0h1"]})


@pytest.fixture
def params(tmp_path):
    rng = np.random.default_rng(0)
    for seed in (0, 1):
        for row, label in ARMS.items():
            shift = 0.3 if row == "qwen_mistill" else 0.0
            notes = {}
            for n in range(6):
                rows = [_row(10 * (k + 1), 5.0, *(5.0 - shift - rng.uniform(0, 0.2, 3))) for k in range(3)]
                if row == "qwen_vanilla_bf16" and n == 0:
                    rows = rows[:2]                 # an event only the treated arm carries: left out of both
                notes[f"n{n}"] = rows
            _write_arm(tmp_path, label, seed, notes)
    return {"paths": {"artifacts": str(tmp_path)},
            "evaluate": {"test_notes": "unused", "teacher_traces": "unused", "events_dir": "unused",
                         "own_heads": {"validation_traces": "unused", "validation_events_dir": "unused", "bins": [2],
                                       "readside_k": 2, "arms": ARMS}},
            "read_side": {"out_dir": "unused", "panel_k": 2, "edits": {"mediation_min_effect": 0.5}},
            "stats": {"bootstrap_resamples": 200, "bootstrap_seed": 0, "confidence": 0.95}}


def _note_effect(rows, positions):
    return np.mean([np.mean([r["margin_identity"] - r["margin"][v] for v in ("filler", "unrelated", "other_category")])
                    for r in rows if r["pos"] in positions])


def test_pair_difference_by_hand(params, tmp_path):
    module = reader()
    values, _ = module.compute_values(params)
    assert set(values) <= set(module.keys(params))
    from mistill.io import read_jsonl

    diffs = []
    for note in (f"n{n}" for n in range(6)):
        shared = {10, 20} if note == "n0" else {10, 20, 30}
        per_seed = []
        for seed in (0, 1):
            treated = read_jsonl(tmp_path / "M6-edits" / f"{ARMS['qwen_mistill']}-s{seed}" / note / "prefix_edit.jsonl")
            control = read_jsonl(tmp_path / "M6-edits" / f"{ARMS['qwen_vanilla_bf16']}-s{seed}" / note / "prefix_edit.jsonl")
            per_seed.append(_note_effect(treated, shared) - _note_effect(control, shared))
        diffs.append(np.mean(per_seed))
    got = values["bf16_qwen_pair_edit_diff"]["value"]
    assert got == pytest.approx(float(np.mean(diffs)))
    assert 0.2 < got < 0.4                                        # the treated arm's edits lower its margin more
    low, high = values["bf16_qwen_pair_edit_diff_interval"]["value"]
    assert low <= got <= high
    assert values["bf16_qwen_pair_edit_diff_notes_higher_lower"]["value"] == [6, 0]
    assert "smollm_pair_edit_diff" not in values                  # a pair with no artifacts is not written


def test_mediated_share_by_hand(params, tmp_path):
    # seed 0 of Mistill: the pair removes 90% of a 1-nat neutral effect at every event
    rows = {f"n{n}": [_row(10, 5.0, 4.0, 4.5, 4.5, ablated=(4.0, 3.9)) for _ in range(1)] for n in range(3)}
    _write_arm(tmp_path, ARMS["qwen_mistill"], 0, rows)
    values, _ = reader().compute_values(params)
    assert values["student_top2_mediated_share_mistill_s0"]["value"] == pytest.approx(0.9)


def test_fp32_pairs_read_the_recipe_variants_against_fp32_vanilla(params, tmp_path):
    """The fp32 pairs: R-D17's fp32 Mistill variants (every seed) and the fp32 pick's seed 0, each seed-matched
    against fp32 Vanilla CoT-KD, on the events both carry; a variant without edits is an error naming the stage."""
    from mistill.distill.runs import FP32_MISTILL_VARIANTS, variant_label
    from mistill.evaluate.matched import FAMILIES

    fp32_label = "student-qwen-vanilla-fp32"
    arms = {**ARMS, "qwen_vanilla_fp32": fp32_label}
    variants_dir = tmp_path / "variants"
    entries = {name: {"student": "qwen", "seed": seed, "precision": "fp32"}
               for names in (FP32_MISTILL_VARIANTS, FAMILIES["fp32"]) for seed, name in enumerate(names)}
    params = {**params, "variants": {"dir": str(variants_dir), "arms": entries},
              "evaluate": {**params["evaluate"], "own_heads": {**params["evaluate"]["own_heads"], "arms": arms}}}
    drops = {name: 0.1 * (i + 1) for i, name in enumerate(entries)}   # each variant's own edit effect, in nats
    for seed in (0, 1, 2):
        _write_arm(tmp_path, fp32_label, seed, {f"n{n}": [_row(10, 5.0, 4.8, 4.8, 4.8)] for n in range(4)})
    for name, entry in entries.items():
        if name == "fp32pick2":
            continue                        # R-D28 reads the fp32 pick's seed 0 only
        _write_arm(variants_dir, variant_label(name, entry), entry["seed"],
                   {f"n{n}": [_row(10, 5.0, *[4.8 - drops[name]] * 3)] for n in range(4)})
    values, inputs = reader().compute_values(params)
    # every note: (0.2 + drop) - 0.2 = the variant's drop; seed-matched, then averaged over the seeds
    assert values["fp32_pair_lambda01_edit_diff"]["value"] == pytest.approx(
        np.mean([drops[n] for n in FP32_MISTILL_VARIANTS]))
    assert values["fp32_pair_lambda001_edit_diff"]["value"] == pytest.approx(drops[FAMILIES["fp32"][0]])
    assert "1 seed pair(s)" in values["fp32_pair_lambda001_edit_diff"]["statistic"]
    assert values["fp32_pair_lambda01_edit_diff_notes_higher_lower"]["value"] == [4, 0]
    assert set(values) <= set(reader().keys(params))
    assert variants_dir / "M6-edits" / f"student-qwen-{FAMILIES['fp32'][0]}-fp32-s0" / "prefix_edit.json" in inputs

    import shutil

    shutil.rmtree(variants_dir / "M6-edits" / f"student-qwen-{FP32_MISTILL_VARIANTS[1]}-fp32-s1")
    from mistill.errors import UserError

    with pytest.raises(UserError, match="M6-variant-edits"):
        reader().compute_values(params)
