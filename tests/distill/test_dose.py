"""Dose matching (mistill.distill.dose) on hand-worked loss logs."""

import json

import pytest

from mistill.distill.dose import first_step_extra, matched_lambda, unit_extra
from mistill.errors import UserError


def test_unit_extra_sums_every_phase_term_and_nothing_else():
    log = {"P1_attn": 0.5, "P1_inter": 0.1, "P2_attn": 0.25, "P2C_write": 0.05, "attn": 0.75, "cot": 3.0, "loss": 9.0}
    assert unit_extra(log) == pytest.approx(0.9)


def test_matched_lambda_scales_the_reference_dose_by_the_variants_unit_terms():
    # two notes with 0.4 and 0.8 nats of terms at lambda 1: mean 0.6; Mistill added 0.12 at its first step
    logs = [{"P1_attn": 0.4}, {"P2_attn": 0.5, "P2C_attn": 0.3}]
    assert matched_lambda(0.12, logs) == pytest.approx(0.2)
    with pytest.raises(UserError, match="no λ matches"):
        matched_lambda(0.12, [{"cot": 1.0}])


def test_first_step_extra_reads_step_one_of_a_training_log(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ({"step": 1, "loss": 0.27, "cot": 0.15, "extra": 0.12},
                                                             {"step": 2, "loss": 0.2, "cot": 0.19, "extra": 0.01})))
    assert first_step_extra(path) == pytest.approx(0.12)
    with pytest.raises(UserError, match="train it first"):
        first_step_extra(tmp_path / "missing.jsonl")
