"""Dose matching (App. M.1): the λ at which a variant's extra loss at the start equals Mistill's.

A control that changes which heads or terms the mechanism loss supervises also changes how much loss it
adds, so a difference in outcome could be a difference in dose.  The paper fixes the dose of such a
control ("λ raised to 0.135 so that the extra loss matches Mistill's at the start", App. M.1; the uniform
attention arm).  The extra loss of a step is read as the training log writes it: each term's mean over the
step's notes that have it (`<phase>_<term>`, Trainer.train_step's reduction), weighted by its phase's λ,

    E(λ_P1, λ_P2) = λ_P1 · Σ_t T̄_{P1,t} + λ_P2 · Σ_t (T̄_{P2,t} + T̄_{P2C,t}),

and the variant's common λ is

    λ_V = E_Mistill / E_V(1, 1).

E_Mistill comes from Mistill's own first step (its `metrics.jsonl`, step 1, and the λs of its
`config.json`; the same student, precision and seed, hence the same first batch); E_V(1, 1) from the
variant's terms on that batch before any update.  Every term enters the loss linearly in its λ (objective
Eq. F), so training the variant with λ_P1 = λ_P2 = λ_V makes its first-step extra loss E_Mistill; a variant
equal to Mistill gets Mistill's λ back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from mistill.distill.objective import ALL_TERMS, PHASES
from mistill.distill.trainer import read_metrics
from mistill.errors import UserError
from mistill.io import read_json

TERM_KEYS = tuple(f"{phase}_{term}" for phase in PHASES for term in sorted(ALL_TERMS))


def term_means(logs: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each logged term's mean over the notes that have it (the training log's reduction of a step)."""
    return {key: float(np.mean([log[key] for log in logs if key in log])) for key in TERM_KEYS
            if any(key in log for log in logs)}


def extra_loss(means: Mapping[str, float], lambda_p1: float, lambda_p2: float) -> float:
    """E(λ_P1, λ_P2): the loss the mechanism terms add to L_CoT at one step."""
    return float(sum((lambda_p1 if key.startswith("P1_") else lambda_p2) * value for key, value in means.items()))


def first_step_extra(run_dir: Path) -> float:
    """A Mistill run's extra loss at its first optimiser step (metrics.jsonl step 1, its config's λs)."""
    return step_extra(run_dir, first=True)


def step_extra(run_dir: Path, *, first: bool) -> float:
    """The loss a run adds to L_CoT at its first (or last) logged optimiser step: a Mistill run's mechanism
    terms at its config's λs, or an event-weighted Vanilla run's `event_extra` (App. M.1, the evw4 control)."""
    metrics, config = run_dir / "metrics.jsonl", run_dir / "config.json"
    if not metrics.is_file() or not config.is_file():
        raise UserError(f"{run_dir}: no training log (metrics.jsonl and config.json); train it first")
    rows = read_metrics(metrics)
    step = 1 if first else max((r.get("step", 0) for r in rows), default=0)
    rows = [r for r in rows if r.get("step") == step]
    arm = read_json(config, "training run config").get("arm") or {}
    if rows and "event_extra" in rows[0]:
        return float(rows[0]["event_extra"])
    if not rows or "lambda_p1" not in arm or "lambda_p2" not in arm:
        raise UserError(f"{run_dir}: no {'first' if first else 'last'} step with its λs in the run's log and config")
    return extra_loss(term_means(rows), float(arm["lambda_p1"]), float(arm["lambda_p2"]))


def matched_lambda(reference_extra: float, first_batch_logs: Sequence[Mapping[str, float]]) -> float:
    """λ_V = E_reference / E_V(1, 1) over the first batch's per-note loss logs."""
    at_unit = extra_loss(term_means(first_batch_logs), 1.0, 1.0)
    if not np.isfinite(at_unit) or at_unit <= 0:
        raise UserError(f"the variant's mechanism terms are {at_unit} at the start: no λ matches a dose to it")
    return reference_extra / at_unit


def match_dose(trainer, reference_extra: float) -> float:
    """Set the trainer's λ_P1 = λ_P2 = λ_V before its first step, and record the match in its run config."""
    lam = matched_lambda(reference_extra, trainer.first_batch_logs())
    trainer.arm = replace(trainer.arm, lambda_p1=lam, lambda_p2=lam)
    trainer.run_config["arm"] = trainer.arm.as_dict()
    trainer.run_config["dose"] = {"rule": "match the reference's extra loss at the first step",
                                  "reference_extra": reference_extra, "lambda": lam}
    return lam
