"""`mistill baselines train`: the off-policy baseline arms of Table 2 (App. J.3) on the shared trainer;
`mistill baselines onpolicy`: the on-policy arms (OPD, GOLD) through TRL."""

from __future__ import annotations

from pathlib import Path

from mistill.errors import UserError


def _responses(path: Path) -> dict[str, dict]:
    from mistill.io import iter_json_lines

    if not path.exists():
        raise UserError(f"{path}: no student responses for DistiLLM-2 (run `dvc repro pipelines/distill/dvc.yaml:DT-responses` first)")
    return {row["note_id"]: row for _, row in iter_json_lines(path, "student responses")}


def cmd_train(args) -> int:
    import torch

    from mistill.baselines import arms
    from mistill.distill.runs import run_dir
    from mistill.distill.targets import check_teacher, read_note_targets
    from mistill.distill.targets_pass import load_traces
    from mistill.distill.trainer import precision_dtype
    from mistill.distill.training_run import run_identity, train_config
    from mistill.io import provenance
    from mistill.models.fingerprint import model_fingerprint
    from mistill.models.loading import ModelSpec, load_model, resolve_device, set_threads
    from mistill.params import load_params

    params = load_params()
    cfg, section = params["distill"], params["baselines"][args.arm]
    set_threads(params["models"])
    device = resolve_device(params["models"].get("device"))
    precision = args.precision or section["precision"]
    seed = int(args.seed)
    targets_dir = Path(args.targets or cfg["targets_dir"])
    teacher_spec = params["models"]["teacher"]
    teacher_model_spec = ModelSpec.from_params(params["models"], teacher_spec, base="teacher", attn_implementation="sdpa")
    manifest = check_teacher(targets_dir / "manifest.json", model_fingerprint(teacher_model_spec), str(teacher_spec))
    # the teacher runs online (App. J.3), as it ran the traces: its dtype, YaRN and revision
    teacher, teacher_tok = load_model(teacher_model_spec, device=device)
    torch.manual_seed(seed)
    student_spec = params["models"].get(args.student, args.student)
    student, student_tok = load_model(ModelSpec.from_params(params["models"], args.student,
                                                            dtype=precision_dtype(precision),
                                                            attn_implementation="sdpa"), device=device)
    train_cfg = train_config(cfg["train"], precision, seed, lr=args.lr)
    out = Path(args.out) if args.out else run_dir(params["baselines"]["dir"], args.student, args.arm, precision, seed)
    run_config = {**run_identity(student_spec, teacher_spec, targets_dir, manifest),
                  "provenance": provenance({"baselines": {args.arm: section}, "distill": {"train": cfg["train"]}},
                                           seed=seed)}
    if args.arm == "featurekd":
        config = arms.FeatureKDConfig(positions=int(section["positions"]), layer_pairs=int(section["layer_pairs"]),
                                      attn_weight=float(section["attn_weight"]),
                                      hidden_weight=float(section["hidden_weight"]))
        notes = [arms.prepare_featurekd_note(*read_note_targets(targets_dir / f"{note_id}.npz"), student_tok,
                                             teacher_tok, config, seed, index)
                 for index, note_id in enumerate(manifest["notes"])]
        trainer = arms.FeatureKDTrainer(student, teacher, notes, config, train_cfg, out, run_config=run_config,
                                        restart_if_different=True)
    else:
        config = arms.DistiLLM2Config(alpha=float(section["alpha"]), beta=float(section["beta"]))
        responses_path = Path(args.responses or section["responses"].format(label=args.student.removeprefix("student_")))
        responses = _responses(responses_path)
        traces = {t["note_id"]: t for t in load_traces(Path(cfg["traces"]), set(manifest["notes"]))}
        missing = [n for n in manifest["notes"] if n not in responses or n not in traces]
        if missing:
            raise UserError(f"{responses_path}: no student response or teacher trace for {len(missing)} training "
                            f"notes (e.g. {missing[0]}); regenerate the responses for the training notes")
        arms.check_shared_vocabulary(student, teacher, student_tok, teacher_tok,
                                     traces[manifest["notes"][0]]["completion"])
        notes = [arms.prepare_distillm2_note(traces[n], responses[n], student_tok) for n in manifest["notes"]]
        run_config["responses"] = str(responses_path)
        trainer = arms.DistiLLM2Trainer(student, teacher, notes, config, train_cfg, out, run_config=run_config,
                                        restart_if_different=True)
    rows = trainer.run(max_steps=args.max_steps)
    if hasattr(student_tok, "save") and (out / "model").exists():
        student_tok.save(out / "model")
    print(f"{args.arm}: {len(rows)} optimiser steps -> {out}")
    return 0


def cmd_onpolicy(args) -> int:
    import time

    import torch

    from mistill.baselines import onpolicy
    from mistill.distill.runs import run_dir
    from mistill.distill.targets_pass import load_traces
    from mistill.io import provenance, read_json
    from mistill.models.loading import ModelSpec, load_model, resolve_device, set_threads
    from mistill.params import load_params

    params = load_params()
    cfg = params["distill"]
    section = (params.get("baselines") or {}).get(args.arm)
    if not section:
        raise UserError(f"params.yaml has no baselines.{args.arm} section for the active profile "
                        f"({params['profile']})")
    config = onpolicy.OnPolicyConfig.from_params(args.arm, section, cfg["train"], lr=args.lr)
    set_threads(params["models"])
    device = resolve_device(params["models"].get("device"))
    seed = int(args.seed)
    targets_dir = Path(args.targets or cfg["targets_dir"])
    manifest = read_json(targets_dir / "manifest.json", "targets manifest")
    traces = onpolicy.training_traces(load_traces(Path(cfg["traces"]), set(manifest["notes"])), manifest["notes"],
                                      config.max_notes)
    teacher_spec = params["models"]["teacher"]
    # the teacher scores the rollouts as it wrote the traces: its dtype, YaRN and revision
    teacher, teacher_tok = load_model(ModelSpec.from_params(params["models"], teacher_spec, base="teacher",
                                                            attn_implementation="sdpa"), device=device)
    torch.manual_seed(seed)
    student_spec = params["models"].get(args.student, args.student)
    student, student_tok = load_model(ModelSpec.from_params(params["models"], args.student, dtype="bfloat16",
                                                            attn_implementation="sdpa"), device=device)
    out = Path(args.out) if args.out else run_dir(params["baselines"]["dir"], args.student, args.arm, "bf16", seed)
    started = time.perf_counter()
    run_config = onpolicy.train(
        config, student, teacher, student_tok, teacher_tok, traces, out, seed, student_name=str(student_spec),
        teacher_name=str(teacher_spec), max_steps=args.max_steps,
        run_config={"targets": str(targets_dir), "traces": str(cfg["traces"]),
                    "provenance": provenance({"baselines": {args.arm: section}, "distill": {"train": cfg["train"]}},
                                             seed=seed)})
    if hasattr(student_tok, "save") and (out / "model").exists():
        student_tok.save(out / "model")
    print(f"{args.arm}: {run_config['total_steps']} optimiser steps in all, "
          f"{time.perf_counter() - started:.0f} s this run -> {out}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train one baseline arm: Feature-KD or DistiLLM-2 (App. J.3)")
    p.add_argument("--arm", choices=("featurekd", "distillm2"), required=True)
    p.add_argument("--student", default="student_qwen", help="params models key (student_<label>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", choices=("bf16", "fp32"), help="default: params baselines.<arm>.precision")
    p.add_argument("--targets", help="teacher targets directory (default: params distill.targets_dir)")
    p.add_argument("--responses", help="DistiLLM-2: the untrained student's generations on the training notes "
                                       "(default: params baselines.distillm2.responses)")
    p.add_argument("--lr", type=float)
    p.add_argument("--max-steps", type=int, help="stop after this many optimiser steps (resumable)")
    p.add_argument("--out", help="run directory (default: <baselines.dir>/DT-000/student-<label>-<arm>-<precision>-s<seed>)")
    p.set_defaults(func=cmd_train)

    p = subparsers.add_parser("onpolicy", help="train one on-policy baseline arm through TRL: OPD or GOLD (App. J.3)")
    p.add_argument("--arm", choices=("opd", "gold"), required=True)
    p.add_argument("--student", default="student_qwen", help="params models key (student_<label>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--targets", help="teacher targets directory whose manifest names the training notes "
                                     "(default: params distill.targets_dir)")
    p.add_argument("--lr", type=float, help="default: params distill.train.lr (the shared recipe's)")
    p.add_argument("--max-steps", type=int, help="stop after this many optimiser steps (resumable)")
    p.add_argument("--out", help="run directory (default: <baselines.dir>/DT-000/student-<label>-<arm>-bf16-s<seed>)")
    p.set_defaults(func=cmd_onpolicy)
