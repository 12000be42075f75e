"""Dose matching (mistill.distill.dose) on hand-worked loss logs."""

import json

import pytest

from mistill.distill.dose import extra_loss, first_step_extra, matched_lambda, term_means
from mistill.errors import UserError


def test_term_means_reduce_over_the_notes_that_have_a_term_and_ignore_the_rest():
    logs = [{"P1_attn": 0.4, "P2_attn": 0.2, "cot": 3.0, "attn": 0.6}, {"P1_attn": 0.8, "loss": 9.0}]
    assert term_means(logs) == {"P1_attn": pytest.approx(0.6), "P2_attn": pytest.approx(0.2)}


def test_extra_loss_weights_p1_by_lambda_p1_and_p2_p2c_by_lambda_p2():
    means = {"P1_attn": 0.5, "P1_inter": 0.1, "P2_attn": 0.25, "P2C_attn": 0.05}
    assert extra_loss(means, 0.1, 0.2) == pytest.approx(0.1 * 0.6 + 0.2 * 0.3)


def test_matched_lambda_scales_the_reference_dose_by_the_variants_unit_terms():
    # term means at lambda 1: P1_attn 0.4, P2_attn 0.5, P2C_attn 0.3 -> 1.2; Mistill added 0.12 at its first step
    logs = [{"P1_attn": 0.4}, {"P2_attn": 0.5, "P2C_attn": 0.3}]
    assert matched_lambda(0.12, logs) == pytest.approx(0.1)
    with pytest.raises(UserError, match="no λ matches"):
        matched_lambda(0.12, [{"cot": 1.0}])


def test_first_step_extra_reads_step_one_and_the_runs_own_lambdas(tmp_path):
    rows = ({"step": 1, "P1_attn": 0.3, "P2_attn": 0.4, "P2C_inter": 0.1, "cot": 0.15},
            {"step": 2, "P1_attn": 9.0, "cot": 0.19})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "config.json").write_text(json.dumps({"arm": {"lambda_p1": 0.1, "lambda_p2": 0.2}}))
    assert first_step_extra(tmp_path) == pytest.approx(0.1 * 0.3 + 0.2 * 0.5)
    with pytest.raises(UserError, match="train it first"):
        first_step_extra(tmp_path / "missing")
