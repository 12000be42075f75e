"""`mistill evaluate arm | task | fidelity | m1` (App. K): one arm's generations and model against the teacher.

`arm` is what a DVC stage runs: the four steps of one arm's evaluation in one process, each
through its own command's parser, so the files and numbers are those of the single commands and
the interpreter, torch and transformers are loaded once instead of four times.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mistill.errors import UserError
from mistill.models.vllm_backend import generation_processes


def _params():
    from mistill.params import load_params

    return load_params()


def _rows(path: str | Path, what: str) -> list[dict]:
    from mistill.io import read_jsonl

    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no {what}")
    return read_jsonl(path)


def cmd_task(args) -> int:
    from mistill.evaluate.task import task_metrics
    from mistill.io import provenance, write_json
    from mistill.world.notes import load_notes

    cfg = _params()["evaluate"]
    gens = {r["note_id"]: r for r in _rows(args.generations, "generations")}
    test = load_notes(args.notes or cfg["test_notes"])
    missing = [n.note_id for n in test if n.note_id not in gens]
    if missing:
        raise UserError(f"{args.generations}: no generation for {len(missing)} test notes (e.g. {missing[0]})")
    train = load_notes(args.train_notes or cfg["train_notes"])
    preds = [list(gens[n.note_id].get("answer") or []) if gens[n.note_id].get("valid") else [] for n in test]
    valid = [bool(gens[n.note_id].get("valid")) for n in test]
    values = task_metrics(preds, [list(n.gold_codes) for n in test], valid, [list(n.gold_codes) for n in train],
                          ks=tuple(cfg["ks"]), a=float(cfg["psp_a"]), b=float(cfg["psp_b"]))
    write_json(args.out, {"metrics": values, "n_notes": len(test), "generations": str(args.generations),
                          "provenance": provenance({"evaluate": cfg})})
    print(" ".join(f"{k}={v:.4f}" for k, v in values.items()))
    return 0


def cmd_fidelity(args) -> int:
    import numpy as np

    from mistill.evaluate import fidelity as fd
    from mistill.evaluate.leakage_adjusted import leak_flags, leakage_adjusted
    from mistill.io import provenance, write_json

    params = _params()
    cfg = params["evaluate"]
    teacher = {r["note_id"]: r for r in _rows(args.teacher_traces or cfg["teacher_traces"], "teacher traces")}
    out: dict = {}
    per_note: dict = {}
    leakage_section = None
    if args.generations:
        gens = [r for r in _rows(args.generations, "generations") if r["note_id"] in teacher]
        bleu = {r["note_id"]: fd.sentence_bleu4(fd.reasoning_block(r["completion"]),
                                                fd.reasoning_block(teacher[r["note_id"]]["completion"])) for r in gens}
        out["bleu4"] = float(np.mean(list(bleu.values()))) if bleu else float("nan")
        per_note["bleu4"] = bleu
    if args.model:

        from mistill.models.loading import ModelSpec, load_model, resolve_device, set_threads

        set_threads(params["models"], args.threads)
        model, tok = load_model(ModelSpec.from_params(params["models"], args.model,  # the profile's dtype, YaRN;
                                                      attn_implementation="sdpa"),   # logits only: the fused kernel
                                device=resolve_device(params["models"].get("device")))
        if args.note_ids:
            ids = args.note_ids.split(",")
        else:  # the test notes' teacher traces (the trace file also holds the training notes)
            from mistill.world.notes import load_notes

            ids = [n.note_id for n in load_notes(args.notes or cfg["test_notes"]) if n.note_id in teacher]
        missing = [n for n in ids if n not in teacher]
        if missing:
            raise UserError(f"no teacher trace for {len(missing)} note(s) (e.g. {missing[0]})")
        nll = {n: fd.teacher_forced_nll(model, tok, teacher[n]["prompt"], teacher[n]["completion"]) for n in ids}
        out["ppl_median"] = fd.median_ppl(list(nll.values()))
        per_note["ppl"] = {n: fd.ppl_from_nll(v) for n, v in nll.items()}
    if args.simulator:
        sim = _rows(args.simulator, "simulator predictions")
        answers = [teacher[r["note_id"]].get("answer") or [] for r in sim]
        noted = [r["note_id"] for r in sim]
        gains = fd.simulatability_gain_per_note([r["with_rationale"] for r in sim], [r["note_only"] for r in sim],
                                                answers)
        per_note["las"] = dict(zip(noted, gains))   # `las`: App. K's name for its simulatability gain
        out["las"] = float(np.mean(list(per_note["las"].values()))) if sim else float("nan")
        answered_alone = ["rationale_only" in r for r in sim]
        if sim and all(answered_alone):
            leaking = leak_flags([r["rationale_only"] for r in sim], answers)
            per_note["leaks"] = dict(zip(noted, leaking))
            adjusted = leakage_adjusted(gains, leaking)
            out["las_leakage_adjusted"] = adjusted.value
            leakage_section = adjusted.as_dict()
        elif any(answered_alone):
            raise UserError(f"{args.simulator}: rationale-only answers on {sum(answered_alone)} of {len(sim)} "
                            "notes; rerun `mistill simulator predict`")
    if not out:
        raise UserError("nothing to compute: give --generations (BLEU-4), --model (PPL) or --simulator (LAS)")
    record = {"metrics": out, "per_note": per_note}
    if leakage_section is not None:
        record["leakage_adjusted"] = leakage_section
    write_json(args.out, {**record, "provenance": provenance({"evaluate": cfg})})
    print(" ".join(f"{k}={v:.4f}" for k, v in out.items()))
    return 0


def cmd_m1(args) -> int:
    from mistill.evaluate.m1 import m1
    from mistill.io import provenance, write_json
    from mistill.models.loading import ModelSpec, load_model, load_tokenizer, resolve_device, set_threads

    params = _params()
    cfg = params["evaluate"]
    set_threads(params["models"], args.threads)
    model, tok = load_model(ModelSpec.from_params(params["models"], args.model,  # the profile's dtype, YaRN;
                                                  attn_implementation="sdpa"),   # logits only: the fused kernel
                            device=resolve_device(params["models"].get("device")))
    teacher_tok = None
    if args.teacher_tokenizer or params["models"].get("teacher"):
        teacher_tok = load_tokenizer(ModelSpec.from_params(params["models"],
                                                           args.teacher_tokenizer or "teacher"))
    traces = _rows(args.teacher_traces or cfg["teacher_traces"], "teacher traces")
    if args.notes:
        from mistill.world.notes import load_notes

        keep = {n.note_id for n in load_notes(args.notes)}
        traces = [t for t in traces if t["note_id"] in keep]
    traces = [t for t in traces if t.get("valid", True)]
    result = m1(model, tok, traces, Path(args.events_dir or cfg["events_dir"]), teacher_tok,
                null_control=args.null_control)
    write_json(args.out, {"m1": result, "model": str(args.model), "provenance": provenance({"evaluate": cfg})})
    print(" ".join(f"{k}: P(m>0)={v['p_margin_positive']:.3f} median={v['median_margin']:.3f}"
                   for k, v in result.items()))
    return 0


ARM_FILES = {"generate": "generations.jsonl", "task": "task.json", "fidelity": "fidelity.json", "m1": "m1.json"}


def arm_steps(model: str, out_dir: Path, m1_notes: str | None, notes: str | None = None,
              teacher_traces: str | None = None, events_dir: str | None = None,
              m1_null: bool = False) -> list[list[str]]:
    """The single commands `arm` runs, in order (the readers find their files by these names); `notes`,
    `teacher_traces` and `events_dir` replace params evaluate's test notes, traces and events (validation);
    `m1_null` reads M1 at the NULL events too (the control)."""
    gens = str(out_dir / ARM_FILES["generate"])

    def given(**options) -> list[str]:
        return [arg for name, v in options.items() if v for arg in (f"--{name.replace('_', '-')}", str(v))]

    return [["generate", "--model", model, *given(notes=notes), "--out", gens],
            ["task", "--generations", gens, *given(notes=notes), "--out", str(out_dir / ARM_FILES["task"])],
            ["fidelity", "--generations", gens, "--model", model, *given(notes=notes, teacher_traces=teacher_traces),
             "--out", str(out_dir / ARM_FILES["fidelity"])],
            ["m1", "--model", model, *given(notes=m1_notes, teacher_traces=teacher_traces, events_dir=events_dir),
             *(["--null-control"] if m1_null else []), "--out", str(out_dir / ARM_FILES["m1"])]]


def commands_parser() -> argparse.ArgumentParser:
    """This group's commands as `mistill evaluate` parses them: what `arm` runs its steps through."""
    parser = argparse.ArgumentParser(prog="mistill evaluate")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    return parser


def cmd_arm(args) -> int:
    """The arm's steps in order. Under torchrun (vllm data parallel) every process generates its notes
    and rank 0 alone runs the steps that read every generation."""
    from mistill.shard import Shard

    parser = commands_parser()
    shard = Shard.from_env()
    generate, *readers = arm_steps(args.model, Path(args.out_dir), args.m1_notes, args.notes, args.teacher_traces,
                                   args.events_dir, args.m1_null)
    for step in [generate, *(readers if shard.leader else [])]:
        step_args = parser.parse_args(step)
        status = step_args.func(step_args)
        if status:
            return int(status)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("arm", help="one arm's evaluation in one process: generate, task, fidelity, m1")
    p.add_argument("--model", required=True, help="the arm's model spec")
    p.add_argument("--out-dir", required=True, help=f"the arm's evaluation directory ({', '.join(ARM_FILES.values())})")
    p.add_argument("--m1-notes", help="notes whose events M1 reads (e.g. the test notes with events)")
    p.add_argument("--notes", help="notes generated on and scored (default: params evaluate.test_notes)")
    p.add_argument("--teacher-traces", help="the teacher's traces of them (default: params evaluate.teacher_traces)")
    p.add_argument("--events-dir", help="their events, which M1 reads (default: params evaluate.events_dir)")
    p.add_argument("--m1-null", action="store_true", help="M1 at the NULL events too (App. K's control)")
    p.set_defaults(func=cmd_arm, sharded=generation_processes)   # one process per vLLM engine

    p = subparsers.add_parser("task", help="micro/macro-F1, P@k, PSP@k, head/tail, valid rate (App. K)")
    p.add_argument("--generations", required=True, help="trace-format jsonl of the arm's test generations")
    p.add_argument("--notes", help="test notes (default: params evaluate.test_notes)")
    p.add_argument("--train-notes", help="training notes for propensities (default: params evaluate.train_notes)")
    p.add_argument("--out", required=True, help="output json")
    p.set_defaults(func=cmd_task)

    p = subparsers.add_parser("fidelity", help="teacher-trace PPL, BLEU-4, LAS (App. K's simulatability gain; "
                                               "Hase et al.'s leakage-adjusted LAS beside it)")
    p.add_argument("--generations", help="the arm's test generations (BLEU-4)")
    p.add_argument("--model", help="the arm's model spec (teacher-trace PPL)")
    p.add_argument("--simulator", help="jsonl {note_id, with_rationale, note_only[, rationale_only]} of simulator "
                                       "answers (LAS; with rationale_only, the leakage-adjusted LAS too)")
    p.add_argument("--teacher-traces", help="default: params evaluate.teacher_traces")
    p.add_argument("--notes", help="notes jsonl whose teacher traces the PPL reads (default: params evaluate.test_notes)")
    p.add_argument("--note-ids", help="comma list of note ids instead of --notes")
    p.add_argument("--threads", type=int, help="intra-op threads (default: params models.threads)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_fidelity)

    p = subparsers.add_parser("m1", help="the student's margin at the teacher's events (App. K, M1)")
    p.add_argument("--model", required=True, help="student model spec")
    p.add_argument("--teacher-traces", help="default: params evaluate.teacher_traces")
    p.add_argument("--teacher-tokenizer", help="decodes the events' competitor ids (default: params models.teacher)")
    p.add_argument("--events-dir", help="default: params evaluate.events_dir")
    p.add_argument("--notes", help="restrict to these notes (e.g. the test notes)")
    p.add_argument("--null-control", action="store_true",
                   help="also at the teacher's NULL events, where nothing is decided (App. K's control)")
    p.add_argument("--threads", type=int, help="intra-op threads (default: params models.threads)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_m1)

    # the own-heads chain and its comparisons (App. J, K, L; R-D6)
    from mistill.evaluate import own_heads_commands

    own_heads_commands.register(subparsers)
    from mistill.evaluate import generate_commands  # test-note generations per arm (App. J.5)
    generate_commands.register(subparsers)
    from mistill.evaluate import audit_commands  # the blinded audit of contrastive events (App. C)
    audit_commands.register(subparsers)
    from mistill.evaluate.evidence_flip import commands as evidence_flip_commands  # App. N's cohort
    evidence_flip_commands.register(subparsers)
