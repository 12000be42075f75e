"""The mechanism terms' diagnostic pass (App. I.2, the paper's diag_mech_terms): what a run did to its terms.

App. I.2 reports the removed write term through a before-and-after reading of one run: "trained at
lambda = (1, 1), the P1 write term fell by 93% while the student-teacher correlation of c went from
+0.11 to -0.06", and, standardised, "the term then learns the teacher's pattern (correlation +0.38)".
The pass reads a student, with no update, on every training note of its run, exactly as the trainer's
forward does (the same pools, rows and teacher targets, `mistill.distill.arms.notes_forward`):

* each phase's terms, all three whatever the run trained with (attention, interaction, write in the
  run's form, raw or standardised per note; `mistill.distill.objective`), averaged over the notes as the
  trainer's log averages them;
* each phase's contributions c (Eq. D) at the events both models hold, the student's beside the
  teacher's, and their Pearson correlation over every event of the phase pooled across notes (the
  contributions themselves: the standardised form changes the term, not what is correlated).

`diagnose_run` reads the run's untrained student ("before", what the first optimiser step sees) and its
trained model ("after"); the P1 drop is 100 * (1 - after / before) of the P1 write term.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy import stats

from mistill.distill import objective as obj

PHASES = obj.PHASES


@torch.no_grad()
def measure_terms(model, notes: list, pools: dict, *, window: int, write_norm: bool, autocast_bf16: bool) -> dict:
    """Each phase's mean terms over `notes` and the pooled correlation of c^S with c^T at its events;
    `autocast_bf16`: the forward under bf16 autocast, as the trainer runs fp32 master weights (App. J.2)."""
    from tqdm import tqdm

    from mistill.distill.arms import ArmConfig, aligned_events, mechanism_terms, notes_forward
    from mistill.distill.mechanism import read_mechanism, supervised_layers
    from mistill.distill.pooled_attention import SupervisedRows

    arm = ArmConfig(arm="mistill", terms=tuple(sorted(obj.ALL_TERMS)), write_norm=write_norm, window=window)
    device = next(model.parameters()).device
    rows_hook = SupervisedRows(model, supervised_layers(pools, pools.get("P1")), row_chunk=arm.row_chunk)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if autocast_bf16 else contextlib.nullcontext()
    terms: dict[str, dict[str, list[float]]] = {p: {t: [] for t in sorted(obj.ALL_TERMS)} for p in PHASES}
    c_pairs: dict[str, tuple[list[float], list[float]]] = {p: ([], []) for p in PHASES}
    try:
        for batch in tqdm(notes, desc="mechanism terms", unit="note"):
            with autocast:
                _, plans = notes_forward(model, [batch], arm, pools, rows_hook)
                mech = read_mechanism(model, plans[0], rows_hook, 0)
                per_phase = mechanism_terms(mech, batch, arm, device)
            for phase, values in per_phase.items():
                for name, v in values.items():
                    terms[phase][name].append(float(v))
            for phase in PHASES:
                student, teacher = mech[phase], batch.teacher.get(phase)
                if student is None or teacher is None:
                    continue
                si, ti = aligned_events(student["event_index"], teacher["event_index"])
                c_pairs[phase][0].extend(student["c"][si].float().cpu().tolist())
                c_pairs[phase][1].extend(np.asarray(teacher["c"], dtype=float)[ti].tolist())
            rows_hook.release()
    finally:
        rows_hook.remove()
    out = {}
    for phase in PHASES:
        cs, ct = (np.asarray(x, dtype=float) for x in c_pairs[phase])
        out[phase] = {"terms": {name: float(np.mean(v)) for name, v in terms[phase].items() if v},
                      "notes": len(terms[phase]["write"]), "events": int(cs.size),
                      "c_correlation": c_correlation(cs, ct)}
    return out


def c_correlation(c_student: np.ndarray, c_teacher: np.ndarray) -> float | None:
    """Pearson r of the student's and teacher's contributions over the events (None: fewer than three events or
    a constant side, where r is undefined)."""
    if c_student.size < 3 or np.ptp(c_student) == 0 or np.ptp(c_teacher) == 0:
        return None
    return float(stats.pearsonr(c_student, c_teacher).statistic)


def write_drop_percent(before: Mapping[str, Any], after: Mapping[str, Any], phase: str = "P1") -> float:
    """100 * (1 - after / before) of a phase's write term: how far training moved it (App. I.2's 93% at P1)."""
    start, end = before[phase]["terms"]["write"], after[phase]["terms"]["write"]
    return 100.0 * (1.0 - end / start)


def diagnose_run(params: Mapping[str, Any], spec) -> dict:
    """Run `spec`'s terms on its training notes before (its untrained student) and after (its trained model)."""
    from mistill.distill.trainer import precision_dtype
    from mistill.distill.training_run import run_inputs
    from mistill.models.loading import ModelSpec, load_model, resolve_device

    inputs = run_inputs(params, spec)
    if inputs.pools is None:
        raise ValueError(f"{spec.out}: the diagnostic pass reads a Mistill run's pools; this run has none")
    # fp32 master weights compute under bf16 autocast, as the trainer's forward does (App. J.2)
    options = {"window": spec.window, "write_norm": spec.write_norm, "autocast_bf16": spec.precision == "fp32"}
    before = measure_terms(inputs.student, inputs.notes, inputs.pools, **options)
    trained, _ = load_model(ModelSpec.from_params(params["models"], str(Path(spec.out) / "model"), base=spec.student,
                                                  dtype=precision_dtype(spec.precision), attn_implementation="sdpa"),
                            device=resolve_device(params["models"].get("device")))
    after = measure_terms(trained, inputs.notes, inputs.pools, **options)
    return {"run": str(spec.out), "terms_trained": list(spec.terms), "write_norm": spec.write_norm,
            "notes": [n.note_id for n in inputs.notes], "before": before, "after": after,
            "write_drop_percent": {p: write_drop_percent(before, after, p) for p in PHASES
                                   if before[p]["terms"].get("write") and "write" in after[p]["terms"]}}
