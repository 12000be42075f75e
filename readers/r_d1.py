"""R-D1 (Table 2, App. L.2): the untrained students on the test notes: micro-F1, valid rate, M1.

Reads each untrained arm's evaluation directory (see `mistill.evaluate.readout`).
"""

from __future__ import annotations

from pathlib import Path

from mistill.evaluate.readout import (
    GENERATION_BEHAVIOUR,
    answers,
    arm_labels,
    generation_behaviour,
    load_arms,
    m1_shares,
    m1_text,
    main_for,
    test_notes,
    value,
    write,
)

__all__ = ["compute_values", "keys", "write"]

READER = "readers/r_d1.py"
ROWS = (("qwen_untrained", "qwen3_4b_untrained"), ("smollm_untrained", "smollm3_3b_untrained"))


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params` (one set per untrained row params name)."""
    labels = arm_labels(params)
    return [f"{prefix}_{what}" for row, prefix in ROWS if row in labels
            for what in ("microf1", "valid_rate", "m1_p1_p2_p2c", *GENERATION_BEHAVIOUR)]


# ---- R-D1 -------------------------------------------------------------------------------------------------

def compute_values(params: dict) -> tuple[dict, list[Path]]:
    arms = load_arms(params)
    notes = test_notes(params)
    v: dict = {}
    inputs: list[Path] = []
    for row, prefix in ROWS:
        if row not in arms:
            continue
        arm = arms[row][min(arms[row])]
        answers(arm.generations, notes, arm.path / "generations.jsonl")  # every test note generated
        inputs += arm.files()
        note = f"untrained student, {len(notes)} test notes, one sample per note (per-note seeds)"
        v[f"{prefix}_microf1"] = value(arm.task["micro_f1"], f"corpus micro-F1 ({note})", arm.path)
        v[f"{prefix}_valid_rate"] = value(arm.task["valid_rate"], f"share of generations valid ({note})", arm.path)
        shares = m1_shares(arm)
        if shares is not None:
            v[f"{prefix}_m1_p1_p2_p2c"] = value(shares, m1_text(arm), arm.path / "m1.json")
        v.update(generation_behaviour({arm.seed: arm}, prefix))
    return v, inputs


if __name__ == "__main__":
    raise SystemExit(main_for("R-D1", READER, compute_values, keys))
