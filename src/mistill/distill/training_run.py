"""Train one resolved run (`mistill.distill.run_spec.RunSpec`): load the student and the teacher's targets,
build the arm's objective and pools, and run the shared trainer (App. J.2) into the run's directory.

`distill train`, the recipe variants' stage and each λ-grid cell call `train_run`; a Mistill run under
`dose: match` takes its λ from the trainer's first step (App. M.1), and a Mistill variant whose recipe is the
main run's takes that run's files instead of training again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mistill.distill.run_spec import RunSpec
from mistill.distill.runs import run_dir
from mistill.errors import UserError
from mistill.io import file_sha256, provenance, read_json


def train_config(section: Mapping[str, Any], precision: str, seed: int, lr: float | None = None):
    """The shared recipe (params `distill.train`) for one precision arm and seed (App. J.2)."""
    from mistill.distill.trainer import TrainConfig

    return TrainConfig(epochs=int(section["epochs"]), batch=int(section["batch"]), lr=float(lr or section["lr"]),
                       warmup_frac=float(section["warmup_frac"]), clip=float(section["clip"]), precision=precision,
                       seed=seed, gradient_checkpointing=bool(section["gradient_checkpointing"]),
                       offload_checkpoints=bool(section.get("offload_checkpoints", False)),
                       mlp_chunk=int(section.get("mlp_chunk", 0)), save_every=int(section.get("save_every", 1)),
                       notes_per_forward=int(section.get("notes_per_forward", 1)))


def run_identity(student_spec, teacher_spec, targets_dir: Path, manifest: dict) -> dict:
    """What a run's checkpoint must share to be resumed: the student's weights, the teacher and the
    targets' content (not only their directory)."""
    weights = Path(str(student_spec)) / "model.safetensors"
    targets_sha256 = hashlib.sha256("".join(f"{n}:{file_sha256(targets_dir / f'{n}.npz')};"
                                            for n in manifest["notes"]).encode()).hexdigest()
    return {"student": str(student_spec), "student_sha256": file_sha256(weights) if weights.exists() else None,
            "teacher": str(teacher_spec), "teacher_hash": manifest["teacher_hash"], "targets_sha256": targets_sha256,
            "targets": str(targets_dir)}


@dataclass
class RunInputs:
    """What a run trains from: the student as loaded for its precision, the arm, the pools and the notes."""

    student: Any
    student_tok: Any
    arm: Any                   # mistill.distill.arms.ArmConfig
    pools: dict | None         # the student's head pools (a Mistill run)
    notes: list                # one NoteBatch per training note
    manifest: dict             # the targets' manifest
    targets_dir: Path
    student_spec: str


def run_inputs(params: Mapping[str, Any], spec: RunSpec) -> RunInputs:
    """Load the student and the teacher's targets of run `spec` and build its arm and pools (a RandPos run's own
    targets are computed here, inside its directory)."""
    import torch

    from mistill.distill import arms
    from mistill.distill import pools as pl
    from mistill.distill.subsets import training_subset
    from mistill.distill.targets import check_teacher, read_note_targets
    from mistill.distill.targets_pass import teacher_targets
    from mistill.distill.trainer import precision_dtype
    from mistill.models.fingerprint import model_fingerprint
    from mistill.models.loading import ModelSpec, load_model, load_tokenizer, resolve_device, set_threads

    set_threads(params["models"])
    student_spec = params["models"].get(spec.student, spec.student)
    targets_dir = spec.targets
    if spec.positions != "events":
        # RandPos (App. M.1): the run's own targets on the notes of the event targets, the events moved with the
        # run's seed, inside its directory (the one pass here that loads the teacher)
        notes = read_json(targets_dir / "manifest.json", "targets manifest")["notes"]
        targets_dir = spec.out / "targets"
        teacher_targets(params, {"teacher": spec.teacher}, targets_dir, positions=spec.positions,
                        position_seed=spec.seed, note_ids=set(notes))
    teacher = ModelSpec.from_params(params["models"], spec.teacher, base="teacher")
    # the targets name their teacher by its files: the teacher is loaded only for RandPos targets, above
    manifest = check_teacher(targets_dir / "manifest.json", model_fingerprint(teacher), str(spec.teacher))
    teacher_tok = load_tokenizer(teacher)
    torch.manual_seed(spec.seed)
    # the precision arm's dtype at load (App. J.2), the student's YaRN factor, sdpa for the training forward
    student, student_tok = load_model(ModelSpec.from_params(params["models"], spec.student,
                                                            dtype=precision_dtype(spec.precision),
                                                            attn_implementation="sdpa"),
                                     device=resolve_device(params["models"].get("device")))
    # Vanilla CoT-KD has no mechanism terms: its record keeps ArmConfig's defaults
    weights = dict(zip(("lambda_p1", "lambda_p2"), spec.lambdas)) if spec.lambdas else {}
    arm = arms.ArmConfig(arm=spec.arm, **weights, terms=spec.terms, write_norm=spec.write_norm, window=spec.window,
                         event_weight=spec.event_weight)
    pools = None
    if spec.arm == "mistill":
        if not spec.head_sets:
            raise UserError(f"no student head sets for {spec.student!r} (params distill.student_head_sets)")
        pools = pl.build_pools(pl.load_head_sets(spec.head_sets), spec.k, mode=spec.heads, pool_seed=spec.pool_seed,
                               source=str(spec.head_sets))
    notes = []
    for note_id in training_subset(manifest["notes"], spec.n_train):
        meta, arrays = read_note_targets(targets_dir / f"{note_id}.npz")
        notes.append(arms.prepare_note(meta, arrays, student_tok, teacher_tok, arm))
    return RunInputs(student, student_tok, arm, pools, notes, manifest, targets_dir, str(student_spec))


def train_run(params: Mapping[str, Any], spec: RunSpec) -> int:
    """Train the run `spec` names (resumable); the number of optimiser steps taken now."""
    from mistill.distill.trainer import Trainer

    cfg = params["distill"]
    inputs = run_inputs(params, spec)
    student, student_tok, arm, pools, notes = inputs.student, inputs.student_tok, inputs.arm, inputs.pools, inputs.notes
    mutated = {}
    if spec.arm == "mistill" and spec.targets_from == "other_notes":
        from mistill.distill.other_notes import targets_of_other_notes

        mutated = {"targets_from": "other_notes", "donors": targets_of_other_notes(notes, seed=spec.seed)}
    run_config = {**run_identity(inputs.student_spec, spec.teacher, inputs.targets_dir, inputs.manifest),
                  "pools": {p: v.as_dict() for p, v in (pools or {}).items()}, **mutated,
                  "provenance": provenance({"distill": cfg}, seed=spec.seed)}
    trainer = Trainer(student, notes, arm, train_config(cfg["train"], spec.precision, spec.seed, lr=spec.lr), spec.out,
                      pools=pools, run_config=run_config, restart_if_different=True)
    if spec.dose == "match":
        from mistill.distill.dose import first_step_extra, match_dose

        # Mistill at the same student, precision and seed: the same first batch (App. M.1)
        reference = run_dir(cfg["runs_dir"], spec.student, "mistill", spec.precision, spec.seed)
        lam = match_dose(trainer, first_step_extra(reference))
        print(f"dose matched to {reference.name}'s first step: lambda_p1 = lambda_p2 = {lam:.4g}")
    main_run = run_dir(cfg["runs_dir"], spec.student, spec.arm, spec.precision, spec.seed)
    if spec.arm == "mistill" and spec.max_steps is None and not spec.retrain and trainer.same_run_as(main_run):
        # a variant whose recipe resolves to the main Mistill run's (the demo's mistillpick: its λ grid is the
        # recipe's) is that run: its files are taken, not trained again (DT-variant reads DT-001); a replicate
        # (`retrain`) trains again, since what it measures is a second run
        trainer.reuse(main_run)
        print(f"{spec.arm}: the same run as {main_run}; its files -> {spec.out}")
        return 0
    rows = trainer.run(max_steps=spec.max_steps)
    if rows and hasattr(student_tok, "save") and (spec.out / "model").exists():   # a finished run is left as it was
        student_tok.save(spec.out / "model")
    print(f"{spec.arm}: {len(rows)} optimiser steps -> {spec.out}")
    return len(rows)
