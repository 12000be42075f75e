"""`mistill distill targets | train`: the teacher precompute and the training arms (App. I, J.2)."""

from __future__ import annotations

from pathlib import Path

from mistill.distill.pools import HEAD_MODES
from mistill.distill.run_spec import TARGET_SOURCES
from mistill.distill.runs import POSITION_RULES
from mistill.errors import UserError


def _params():
    from mistill.params import load_params

    return load_params()


def cmd_targets(args) -> int:
    from mistill.distill.targets_pass import teacher_targets

    params = _params()
    out = Path(args.out or params["distill"]["targets_dir"])
    manifest = teacher_targets(params, vars(args), out, positions=args.positions, position_seed=args.position_seed)
    print(f"teacher targets: {len(manifest['notes'])} notes, {len(manifest['skipped'])} skipped -> {out}")
    return 0


def cmd_train(args) -> int:
    from mistill.distill.run_spec import RunSpec
    from mistill.distill.training_run import train_run

    params = _params()
    train_run(params, RunSpec.resolve(params, vars(args)))
    return 0


def cmd_coverage(args) -> int:

    from mistill.distill import buckets as bk
    from mistill.distill.alignment import coverage
    from mistill.distill.mechanism import note_view
    from mistill.distill.targets import read_note_targets
    from mistill.io import provenance, read_json, write_json
    from mistill.models.loading import ModelSpec, load_tokenizer

    params = _params()
    cfg = params["distill"]
    targets_dir = Path(args.targets or cfg["targets_dir"])
    manifest_path = targets_dir / "manifest.json"
    if not manifest_path.exists():
        raise UserError(f"{manifest_path}: no targets manifest (run `mistill distill targets` first)")
    manifest = read_json(manifest_path, "targets manifest")
    report = {}
    for key in args.students.split(","):
        tok = load_tokenizer(ModelSpec.from_params(params["models"], key))
        teacher_kinds, realized = {}, {}
        for note_id in manifest["notes"]:
            meta, _ = read_note_targets(targets_dir / f"{note_id}.npz")
            view = note_view(tok, bk.build_axis(meta["prompt"], meta["completion"]), meta["events"],
                             meta["competitors"])
            teacher_kinds[note_id] = [e["kind"] for e in meta["events"]]
            realized[note_id] = view.realized
        report[key] = coverage(teacher_kinds, realized)
    write_json(args.out, {"coverage": report, "targets": str(targets_dir), "teacher_id": manifest["teacher_id"],
                          "provenance": provenance({"distill": cfg})})
    for key, rep in report.items():
        print(key, " ".join(f"{k}={rep[k]['share']:.3f}" for k in ("P1", "P2", "P2C")))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("targets", help="teacher targets, once per training note (App. I.5)")
    p.add_argument("--teacher", help="teacher model spec (default: params models.teacher)")
    p.add_argument("--traces", help="teacher traces jsonl (default: params distill.traces)")
    p.add_argument("--notes", help="training notes jsonl (default: params distill.train_notes)")
    p.add_argument("--events-dir", help="<note_id>/events.jsonl directory (default: params distill.events_dir)")
    p.add_argument("--head-sets", help="teacher head_sets_contrast.json (default: params distill.teacher_head_sets)")
    p.add_argument("--prose-sets", help="teacher head_sets_locus.json, whose prose ranking pools the window rows "
                                        "(default: params distill.teacher_prose_sets)")
    p.add_argument("--out", help="targets directory (default: params distill.targets_dir)")
    p.add_argument("--positions", choices=POSITION_RULES, default="events",
                   help="random: each note's events moved to random positions of its trace (RandPos, App. M.1)")
    p.add_argument("--position-seed", type=int, default=0, help="the random positions' seed (a run's training seed)")
    p.set_defaults(func=cmd_targets)

    p = subparsers.add_parser("coverage", help="teacher events each student tokenizer realises (Table 38, R-D19)")
    p.add_argument("--students", default="student_qwen,student_smol", help="comma list of params models keys or specs")
    p.add_argument("--targets", help="targets directory (default: params distill.targets_dir)")
    p.add_argument("--out", required=True, help="output json")
    p.set_defaults(func=cmd_coverage)

    p = subparsers.add_parser("train", help="train one arm: Vanilla CoT-KD or Mistill (App. J.2)")
    p.add_argument("--arm", choices=("vanilla", "mistill"), help="the objective (a --variant names its own)")
    p.add_argument("--student", help="params models key or a model spec (default: student_qwen)")
    p.add_argument("--teacher", help="teacher spec whose targets these are (default: params models.teacher)")
    p.add_argument("--targets", help="targets directory (default: params distill.targets_dir)")
    p.add_argument("--head-sets", help="the student's head_sets_contrast.json (mistill)")
    p.add_argument("--precision", choices=("bf16", "fp32"), help="default: params distill.precision[arm]")
    p.add_argument("--seed", type=int)
    p.add_argument("--lambda-p1", type=float)
    p.add_argument("--lambda-p2", type=float)
    p.add_argument("--lambda-from", help="the selection grid (params selection.grids) whose pick gives each λ not "
                                         "given (default: params distill.lambda_from)")
    p.add_argument("--terms", help="comma list of attn,inter,write (default: params distill.terms)")
    p.add_argument("--write-norm", action="store_true", help="z-score c per note in the write term (App. I.2)")
    p.add_argument("--window", type=int, help="W rows before each P1 event; 0 = the no-window arm")
    p.add_argument("--dose", choices=("match",), help="match: lambda_p1 = lambda_p2 chosen so that the first step's "
                                                      "extra loss equals Mistill's (mistill.distill.dose)")
    p.add_argument("--heads", choices=HEAD_MODES)
    p.add_argument("--pool-seed", type=int)
    p.add_argument("--event-weight", type=float,
                   help="CE and KL times this at the teacher's event and window rows (the evw4 control, App. M.1)")
    p.add_argument("--positions", choices=POSITION_RULES,
                   help="random: the run's own targets, its events moved with its seed (RandPos, App. M.1)")
    p.add_argument("--targets-from", choices=TARGET_SOURCES,
                   help="other_notes: each note trained towards another note's teacher targets (a mutant; "
                        "default: params distill.targets_from, else own)")
    p.add_argument("--k", type=int, help="pool size (default: params distill.pool_k.student)")
    p.add_argument("--n-train", type=int, help="train on this many of the targets' notes, a subset nested in every "
                                               "larger one (the learning curve, App. M.5; default: all)")
    p.add_argument("--lr", type=float)
    p.add_argument("--max-steps", type=int, help="stop after this many optimiser steps (resumable)")
    p.add_argument("--retrain", action="store_true",
                   help="train even where the main Mistill run has this very recipe (a replicate; a --variant "
                        "entry sets it with retrain: true)")
    p.add_argument("--variant", help="a variant of the Mistill recipe (params variants.arms): its student, "
                                     "seed, precision and switches; run under variants.dir")
    p.add_argument("--out", help="run directory (default: <runs_dir>/DT-00x/student-<label>-<arm>-<precision>-s<seed>)")
    p.set_defaults(func=cmd_train)

    from mistill.distill import selection_commands

    selection_commands.register(subparsers)
