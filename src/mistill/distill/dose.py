"""Dose matching (App. M.1): the λ at which a variant's extra loss at the start equals Mistill's.

A control that changes which heads or terms the mechanism loss supervises also changes how much loss it
adds, so a difference in outcome could be a difference in dose.  The paper fixes the dose of such a
control ("λ raised to 0.135 so that the extra loss matches Mistill's at the start", App. M.1; the uniform
attention arm).  With E the extra loss, the mean over the first optimiser step's notes of L - L_CoT:

    λ_V = E_Mistill / E_V(λ = 1)

E_Mistill is read from Mistill's own first step (its `metrics.jsonl`, step 1: `extra`, the λ-weighted
terms each note's log sums in float64, averaged over the step's notes; at the same student, precision and
seed, hence the same first batch); E_V(1) is the variant's mechanism terms on that batch, before any
update, with λ_P1 = λ_P2 = 1, averaged the same way (a note without a phase adds nothing for it).  The terms enter the loss linearly in λ (objective Eq. F),
so training the variant with λ_P1 = λ_P2 = λ_V makes its first-step extra loss E_Mistill.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mistill.distill.objective import ALL_TERMS
from mistill.distill.trainer import read_metrics
from mistill.errors import UserError

PHASES = ("P1", "P2", "P2C")


def unit_extra(log: dict) -> float:
    """One note's mechanism terms summed at λ_P1 = λ_P2 = 1 (its loss log: `<phase>_<term>` entries)."""
    return float(sum(log.get(f"{phase}_{term}", 0.0) for phase in PHASES for term in sorted(ALL_TERMS)))


def first_step_extra(metrics_path: Path) -> float:
    """A Mistill run's extra loss at its first optimiser step: `extra` of step 1 (mean over the step's notes)."""
    if not metrics_path.is_file():
        raise UserError(f"{metrics_path}: no training log of the reference run; train it first")
    rows = [r for r in read_metrics(metrics_path) if r.get("step") == 1]
    if not rows or "extra" not in rows[0]:
        raise UserError(f"{metrics_path}: no first-step extra loss; retrain the reference Mistill run")
    return float(rows[0]["extra"])


def matched_lambda(reference_extra: float, first_batch_logs: Sequence[dict]) -> float:
    """λ_V = E_reference / E_V(1) over the first batch's per-note loss logs."""
    at_unit = float(np.mean([unit_extra(log) for log in first_batch_logs]))
    if not np.isfinite(at_unit) or at_unit <= 0:
        raise UserError(f"the variant's mechanism terms are {at_unit} at the start: no λ matches a dose to it")
    return reference_extra / at_unit


def match_dose(trainer, reference_extra: float) -> float:
    """Set the trainer's λ_P1 = λ_P2 = λ_V before its first step, and record the match in its run config."""
    from dataclasses import replace

    lam = matched_lambda(reference_extra, trainer.first_batch_logs())
    trainer.arm = replace(trainer.arm, lambda_p1=lam, lambda_p2=lam)
    trainer.run_config["arm"] = trainer.arm.as_dict()
    trainer.run_config["dose"] = {"rule": "match the reference's extra loss at the first step",
                                  "reference_extra": reference_extra, "lambda": lam}
    return lam
