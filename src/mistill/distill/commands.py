"""`mistill distill targets | train`: the teacher precompute and the training arms (App. I, J.2)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mistill.distill.runs import POSITION_RULES
from mistill.errors import UserError


def _params():
    from mistill.params import load_params

    return load_params()


def _load_traces(path: Path, train_ids: set[str] | None) -> list[dict]:
    from mistill.io import iter_json_lines

    if not path.exists():
        raise UserError(f"{path}: no teacher traces (run `dvc repro TR-008` first)")
    rows = []
    for where, row in iter_json_lines(path, "teacher traces"):
        if not isinstance(row, dict) or not {"note_id", "prompt", "completion"} <= set(row):
            raise UserError(f"{where}: a trace row needs note_id, prompt and completion")
        rows.append(row)
    return [r for r in rows if train_ids is None or r["note_id"] in train_ids]


def _train_ids(path: Path) -> set[str]:
    from mistill.world.notes import load_notes

    return {n.note_id for n in load_notes(path)}


def prose_pool(cfg: dict, k: int, path: str | None = None):
    """The teacher's prose-time pool for the window rows (App. I.1): the top-k of the prose ranking that
    the locus pass on the shortlist run writes (App. F pass B; params distill.teacher_prose_sets)."""
    from mistill.distill import pools as pl

    path = Path(path or cfg.get("teacher_prose_sets") or "")
    if not path.is_file():
        raise UserError(f"{path}: no prose-time head sets, which a window of {cfg['window']} rows needs "
                        "(run `dvc repro HD-002-locus`, or set distill.window to 0)")
    return pl.build_pool(pl.load_head_sets(path), "prose", k, source=str(path))


def cmd_targets(args) -> int:
    params = _params()
    out = Path(args.out or params["distill"]["targets_dir"])
    manifest = teacher_targets(params, args, out, positions=args.positions, position_seed=args.position_seed)
    print(f"teacher targets: {len(manifest['notes'])} notes, {len(manifest['skipped'])} skipped -> {out}")
    return 0


TARGETS_OPTIONS = ("teacher", "head_sets", "prose_sets", "traces", "notes", "events_dir")   # `targets`' overrides


def teacher_targets(params: dict, args, out: Path, *, positions: str = "events", position_seed: int = 0,
                    note_ids: set[str] | None = None) -> dict:
    """The teacher's targets for the training notes (or `note_ids`) into `out` (App. I.5); `args` holds the
    TARGETS_OPTIONS overrides of the teacher, its head sets, the prose sets, traces, notes and events
    directory (None: params distill)."""
    import torch

    from mistill.distill import pools as pl
    from mistill.distill.targets import compute_targets
    from mistill.io import provenance
    from mistill.models.fingerprint import model_fingerprint
    from mistill.models.loading import ModelSpec, load_model, resolve_device, set_threads

    cfg = params["distill"]
    set_threads(params["models"])
    torch.manual_seed(0)
    teacher_spec = args.teacher or params["models"]["teacher"]
    # the teacher as it ran the traces (dtype, YaRN, revision); sdpa: the same function as eager, no T x T weights
    teacher = ModelSpec.from_params(params["models"], teacher_spec, base="teacher", attn_implementation="sdpa")
    model, tokenizer = load_model(teacher, device=resolve_device(params["models"].get("device")))
    head_sets = pl.load_head_sets(args.head_sets or cfg["teacher_head_sets"])
    k = int(cfg["pool_k"]["teacher"])
    pools = pl.build_pools(head_sets, k, source="teacher head sets")
    prose = prose_pool(cfg, k, args.prose_sets) if int(cfg["window"]) > 0 else None
    traces = _load_traces(Path(args.traces or cfg["traces"]),
                          note_ids or _train_ids(Path(args.notes or cfg["train_notes"])))
    if not traces:
        raise UserError("no teacher traces for the training notes")
    return compute_targets(model, tokenizer, traces, Path(args.events_dir or cfg["events_dir"]),
                           out, pools, prose, window=int(cfg["window"]), topk=int(cfg["topk"]),
                           teacher_id=str(teacher_spec), teacher_hash=model_fingerprint(teacher),
                           provenance=provenance({"distill": cfg}, seed=None), positions=positions,
                           position_seed=position_seed)


def train_config(section: dict, precision: str, seed: int, lr: float | None = None):
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
    import hashlib

    from mistill.io import file_sha256

    weights = Path(str(student_spec)) / "model.safetensors"
    targets_sha256 = hashlib.sha256("".join(f"{n}:{file_sha256(targets_dir / f'{n}.npz')};"
                                            for n in manifest["notes"]).encode()).hexdigest()
    return {"student": str(student_spec), "student_sha256": file_sha256(weights) if weights.exists() else None,
            "teacher": str(teacher_spec), "teacher_hash": manifest["teacher_hash"], "targets_sha256": targets_sha256,
            "targets": str(targets_dir)}


def recipe_lambdas(params: dict, grid: str | None = None) -> tuple[float, float]:
    """The recipe's λ_P1, λ_P2: the pick of the selection grid `grid` or, without one, of the grid params
    distill.lambda_from names (App. I.3; the stage DT-select@<grid>, a dependency of every run that reads it),
    or fixed distill.lambda_p1/lambda_p2."""
    from mistill.distill.selection_commands import selected_lambdas

    if grid:
        return selected_lambdas(params.get("selection") or {}, grid)
    cfg = params["distill"]
    fixed = "lambda_p1" in cfg or "lambda_p2" in cfg
    if cfg.get("lambda_from") and fixed:
        raise UserError("params distill: give lambda_from (a selection grid) or lambda_p1 and lambda_p2, not both")
    if cfg.get("lambda_from"):
        return selected_lambdas(params.get("selection") or {}, cfg["lambda_from"])
    if not ("lambda_p1" in cfg and "lambda_p2" in cfg):
        raise UserError("params distill: no loss weights; give lambda_from (a selection grid) or lambda_p1 and lambda_p2")
    return float(cfg["lambda_p1"]), float(cfg["lambda_p2"])


def apply_variant(args, variants: dict) -> Path:
    """Set `args` from the variant entry `args.variant` (params variants.arms): its student, seed,
    precision and switches, which options given on the command line override; return its run directory."""
    from mistill.distill.runs import VARIANT_SWITCHES, switch_options, variant, variant_run_dir

    entry = variant(variants, args.variant)
    if args.arm is not None and args.arm != entry.get("arm", "mistill"):
        raise UserError(f"--variant {args.variant} trains the {entry.get('arm', 'mistill')} objective, not --arm {args.arm}")
    args.student = f"student_{entry['student']}" if args.student is None else args.student
    for name, value in switch_options(entry, ("seed", "precision", *VARIANT_SWITCHES)).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.retrain = args.retrain or bool(entry.get("retrain", False))
    return variant_run_dir(variants["dir"], args.variant, entry)


def cmd_train(args) -> int:
    import torch

    from mistill.distill import arms
    from mistill.distill import pools as pl
    from mistill.distill.runs import run_dir
    from mistill.distill.subsets import training_subset
    from mistill.distill.targets import check_teacher, read_note_targets
    from mistill.distill.trainer import Trainer, precision_dtype
    from mistill.io import provenance, read_json
    from mistill.models.fingerprint import model_fingerprint
    from mistill.models.loading import ModelSpec, load_model, load_tokenizer, resolve_device, set_threads

    params = _params()
    cfg = params["distill"]
    set_threads(params["models"])
    out = Path(args.out) if args.out else None
    if args.variant:   # its switches always apply; --out moves only its directory
        variant_dir = apply_variant(args, params.get("variants") or {})
        out = out or variant_dir
    if args.arm is None and not args.variant:
        raise UserError("name the objective with --arm (vanilla or mistill), or a recipe variant with --variant")
    args.arm = args.arm or "mistill"   # a variant that names no arm varies the Mistill recipe
    if args.dose == "match" and (args.arm != "mistill" or args.lambda_p1 is not None or args.lambda_p2 is not None):
        raise UserError("--dose match sets lambda_p1 and lambda_p2 of a Mistill run itself; give neither")
    student_key = args.student or "student_qwen"
    student_spec = params["models"].get(student_key, student_key)
    precision = args.precision or cfg["precision"][args.arm]
    seed = int(args.seed if args.seed is not None else cfg["seeds"][0])
    targets_dir = Path(args.targets or cfg["targets_dir"])
    if (args.positions or "events") != "events":
        # RandPos (App. M.1): the run's own targets on the notes of the event targets, the events moved with the
        # run's seed, inside its directory (the one pass here that loads the teacher)
        out = out or run_dir(cfg["runs_dir"], student_key, args.arm, precision, seed)
        notes = read_json(targets_dir / "manifest.json", "targets manifest")["notes"]
        targets_dir = out / "targets"
        overrides = argparse.Namespace(**{**dict.fromkeys(TARGETS_OPTIONS), "teacher": args.teacher})
        teacher_targets(params, overrides, targets_dir, positions=args.positions, position_seed=seed,
                        note_ids=set(notes))
    teacher_spec = args.teacher or params["models"]["teacher"]
    teacher = ModelSpec.from_params(params["models"], teacher_spec, base="teacher")
    # the targets name their teacher by its files: the teacher is loaded only for RandPos targets, above
    manifest = check_teacher(targets_dir / "manifest.json", model_fingerprint(teacher), str(teacher_spec))
    teacher_tok = load_tokenizer(teacher)
    torch.manual_seed(seed)
    # the precision arm's dtype at load (App. J.2), the student's YaRN factor, sdpa for the training forward
    student, student_tok = load_model(ModelSpec.from_params(params["models"], student_key,
                                                            dtype=precision_dtype(precision),
                                                            attn_implementation="sdpa"),
                                     device=resolve_device(params["models"].get("device")))
    terms = tuple(t.strip() for t in (args.terms or ",".join(cfg["terms"])).split(",") if t.strip())
    weights = {}   # Vanilla CoT-KD has no mechanism terms: its record keeps ArmConfig's defaults
    if args.arm == "mistill":
        base = recipe_lambdas(params, args.lambda_from) if None in (args.lambda_p1, args.lambda_p2) else (None, None)
        weights = {f"lambda_{p}": float(given if given is not None else default)
                   for p, given, default in (("p1", args.lambda_p1, base[0]), ("p2", args.lambda_p2, base[1]))}
    arm = arms.ArmConfig(arm=args.arm, **weights,
                         terms=terms, write_norm=bool(args.write_norm or cfg["write_norm"]),
                         window=int(args.window if args.window is not None else cfg["window"]),
                         event_weight=float(args.event_weight if args.event_weight is not None else 1.0))
    pools = None
    if args.arm == "mistill":
        hs_path = args.head_sets or cfg["student_head_sets"].get(student_key)
        if not hs_path:
            raise UserError(f"no student head sets for {student_key!r} (params distill.student_head_sets)")
        head_sets = pl.load_head_sets(hs_path)
        pools = pl.build_pools(head_sets, int(args.k or cfg["pool_k"]["student"]), mode=args.heads or cfg["heads"],
                               pool_seed=int(cfg["pool_seed"] if args.pool_seed is None else args.pool_seed),
                               source=str(hs_path))
    notes = []
    for note_id in training_subset(manifest["notes"], args.n_train):
        meta, arrays = read_note_targets(targets_dir / f"{note_id}.npz")
        notes.append(arms.prepare_note(meta, arrays, student_tok, teacher_tok, arm))
    train_cfg = train_config(cfg["train"], precision, seed, lr=args.lr)
    out = out or run_dir(cfg["runs_dir"], student_key, args.arm, precision, seed)
    run_config = {**run_identity(student_spec, teacher_spec, targets_dir, manifest),
                  "pools": {p: v.as_dict() for p, v in (pools or {}).items()},
                  "provenance": provenance({"distill": cfg}, seed=seed)}
    trainer = Trainer(student, notes, arm, train_cfg, out, pools=pools, run_config=run_config,
                      restart_if_different=True)
    if args.dose == "match":
        from mistill.distill.dose import first_step_extra, match_dose

        # Mistill at the same student, precision and seed: the same first batch (App. M.1)
        reference = run_dir(cfg["runs_dir"], student_key, "mistill", precision, seed)
        lam = match_dose(trainer, first_step_extra(reference))
        print(f"dose matched to {reference.name}'s first step: lambda_p1 = lambda_p2 = {lam:.4g}")
    main_run = run_dir(cfg["runs_dir"], student_key, args.arm, precision, seed)
    if args.arm == "mistill" and args.max_steps is None and not args.retrain and trainer.same_run_as(main_run):
        # a variant whose recipe resolves to the main Mistill run's (the demo's mistillpick: its λ grid is the
        # recipe's) is that run: its files are taken, not trained again (DT-variant reads DT-001); a replicate
        # (`retrain`) trains again, since what it measures is a second run
        trainer.reuse(main_run)
        print(f"{args.arm}: the same run as {main_run}; its files -> {out}")
        return 0
    rows = trainer.run(max_steps=args.max_steps)
    if rows and hasattr(student_tok, "save") and (out / "model").exists():   # a finished run is left as it was
        student_tok.save(out / "model")
    print(f"{args.arm}: {len(rows)} optimiser steps -> {out}")
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
    p.add_argument("--heads", choices=("top", "bottom", "random", "uniform"))
    p.add_argument("--pool-seed", type=int)
    p.add_argument("--event-weight", type=float,
                   help="CE and KL times this at the teacher's event and window rows (the evw4 control, App. M.1)")
    p.add_argument("--positions", choices=POSITION_RULES,
                   help="random: the run's own targets, its events moved with its seed (RandPos, App. M.1)")
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
