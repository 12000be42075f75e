"""`mistill models ...`: the demo models and the teacher trace sets.

    mistill models train-teacher [--role teacher_qwq]
                                   -> <models.teacher>/ (safetensors, config, tokenizer remap, training log)
    mistill models init-students   -> <models.student_qwen>/, <models.student_smol>/ (seeded random init)
    mistill models pretrain-students
                                   -> the same directories, pretrained (models.student_pretraining)
    mistill models traces --set TR-006|TR-007|TR-008
                                   -> <artifacts>/<set>/traces.jsonl and summary.json (resumable per
                                      note, mistill.models.trace_rows); timing.json (uncached)

Parameters come from the active profile (`models`, `decoding`, `seeds`, `paths`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from mistill.errors import UserError
from mistill.models.loading import set_threads
from mistill.models.vllm_backend import generation_processes


def _models(params: dict[str, Any]) -> dict[str, Any]:
    section = params.get("models") or {}
    if not section:
        raise UserError("params.yaml: the active profile has no 'models' section")
    return section


def _loaded_by_id(section: dict[str, Any], keys: list[str]) -> bool:
    """Whether every model named by `keys` is a Hugging Face id (loaded, never trained here)."""
    from mistill.models.loading import is_local_spec

    return all(section.get(k) and not is_local_spec(str(section[k])) for k in keys)


def role_dir(section: dict[str, Any], key: str) -> Path:
    """What the stages depend on for the model `key`: `<models.dir>/<key with dashes>`.

    A local model (the demo's) lives there; a model loaded by id has its pin file there.
    """
    return Path(str(section["dir"])) / key.replace("_", "-")


def _write_pins(section: dict[str, Any], keys: list[str]) -> None:
    """Pin each model loaded by id (id, revision) in its role directory: the stages' dependency, so
    changing a model's id or revision re-runs everything that reads the model."""
    from mistill.io import write_json

    for key in keys:
        pin = role_dir(section, key) / "pin.json"
        pin.parent.mkdir(parents=True, exist_ok=True)
        write_json(pin, {"model": key, "id": str(section[key]), "revision": (section.get("revision") or {}).get(key)})
        print(f"{key}: {section[key]} is loaded by id under this profile; pinned in {pin}")


def _device(name: str | None) -> str:
    import torch

    if name in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def save_model_dir(model: Any, tokenizer: Any, directory: str | Path, extra_json: dict[str, Any]) -> Path:
    """Write weights, config, tokenizer remap and extra json files to a temporary sibling directory and
    swap it into place, so a killed run never leaves a half-written model."""
    from mistill.io import write_json

    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}."))
    os.chmod(staging, 0o755)
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save(staging)
        for name, obj in extra_json.items():
            write_json(staging / name, obj)
        if directory.exists():
            retired = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f".{directory.name}.old."))
            os.replace(directory, retired / directory.name)
            os.replace(staging, directory)
            shutil.rmtree(retired)
        else:
            os.replace(staging, directory)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return directory


def demo_tokenizer(params: dict[str, Any], family: str):
    """The compact tokenizer of a family over the demo corpus (identical for every model of that family)."""
    from mistill.models.scripted_traces import script_trace
    from mistill.models.tokenizers import CompactTokenizer, base_tokenizer, build_remap
    from mistill.models.world_files import cut_for_prompt, load_note_file, load_world, remap_corpus

    world = load_world(params)
    pool = load_note_file(params, "notes.jsonl", world.inventory)
    notes = pool + [cut_for_prompt(n) for n in pool]
    for name in ("corpus_char.jsonl", "dt_train.jsonl", "dt_test.jsonl"):
        try:
            notes += load_note_file(params, name, world.inventory)
        except UserError:
            pass
    base = base_tokenizer(family)
    # a sampled training shortlist can miss every gold code: the trace that says so is shown too
    no_code = script_trace(notes[0], ()).completion if notes else ""
    texts = remap_corpus(world, notes) + [base.chat_prompt(""), no_code]
    return CompactTokenizer(base, build_remap(base, texts))


def teacher_notes(params: dict[str, Any], world: Any) -> list:
    """The teacher's training notes: the pool's `source_split` notes, minus every patient of the
    characterization and distillation-test corpora, cut as prompts are (App. A)."""
    from mistill.models.world_files import cut_for_prompt, load_note_file

    cfg = _models(params)["teacher_training"]
    held_out = set()
    for name in cfg.get("exclude", []):
        held_out |= {n.patient_id for n in load_note_file(params, name, world.inventory)}
    pool = load_note_file(params, "notes.jsonl", world.inventory)
    notes = [cut_for_prompt(n) for n in pool if n.split == cfg["source_split"] and n.patient_id not in held_out]
    notes += [cut_for_prompt(n) for n in extra_teacher_notes(params, world)]
    if not notes:
        raise UserError("teacher training: no notes left after the exclusions")
    return notes


def extra_teacher_notes(params: dict[str, Any], world: Any) -> list:
    """Extra synthetic notes for the teacher alone (`teacher_training.extra_patients`): the world's note
    generator under its own seed, patients renamed `teacher-...`, so they share no id with any corpus.
    They stand in for the pretraining a real teacher brings; no student and no pass ever sees them."""
    cfg = _models(params)["teacher_training"]
    n_extra = int(cfg.get("extra_patients") or 0)
    if not n_extra:
        return []
    return generated_notes(params, world, n_extra, int(cfg["extra_seed"]), "teacher",
                           what="teacher_training.extra_patients")


def generated_notes(params: dict[str, Any], world: Any, n_patients: int, seed: int, prefix: str, *,
                    what: str) -> list:
    """`n_patients` notes of the world's generator under `seed`, one per patient, note and patient ids
    prefixed `<prefix>-` so they share no id with any corpus."""
    from dataclasses import replace

    notes_cfg = (params.get("world") or {}).get("notes") or {}
    if notes_cfg.get("source") != "synthetic":
        raise UserError(f"{what} needs world.notes.source: synthetic")
    from mistill.world.demo_notes import NoteGeneratorConfig, generate_notes

    config = NoteGeneratorConfig.from_params({**notes_cfg, "n_patients": n_patients, "second_note_share": 0.0,
                                              "split_shares": {"train": 1.0}})
    return [replace(n, note_id=f"{prefix}-{n.note_id}", patient_id=f"{prefix}-{n.patient_id}")
            for n in generate_notes(world.inventory, config, seed)]


def cmd_train_teacher(args) -> int:
    from mistill.io import provenance
    from mistill.models.architectures import TinyArchitecture, build_model
    from mistill.models.planted import PlantedHeads
    from mistill.models.train_teacher import build_examples, train
    from mistill.models.world_files import load_world
    from mistill.params import load_params

    params = load_params()
    section = _models(params)
    role = args.role
    if not section.get(role):
        raise UserError(f"params: models.{role} is not set for this profile")
    if _loaded_by_id(section, [role]):  # the paper profile: nothing to train, only a pin to write
        _write_pins(section, [role])
        return 0
    cfg = section.get("teacher_training")
    if not cfg or role not in (section.get("architectures") or {}):
        raise UserError(f"params: models.{role} is a local directory, so it is trained here, and needs "
                        f"models.teacher_training and models.architectures.{role}")
    set_threads(section)
    # every teacher learns the same scripted traces under the same recipe; only the architecture differs
    arch = TinyArchitecture.from_params(section["architectures"][role])
    world = load_world(params)
    tokenizer = demo_tokenizer(params, arch.tokenizer_family)
    notes = teacher_notes(params, world)
    # a role may carry a planted mechanism (mistill.models.planted): its decisions routed through named heads
    planted = PlantedHeads.from_params((cfg.get("planted") or {}).get(role), n_layers=arch.num_hidden_layers,
                                       n_heads=arch.num_attention_heads)
    examples = build_examples(tokenizer, world, notes, seed=int(cfg["seed"]),
                              shortlist_share=float(cfg["shortlist_share"]), shortlist_size=int(cfg["shortlist_size"]),
                              with_decisions=planted is not None)
    # The compact table covers the demo corpus; teacher-only extra notes may hold a rare token outside
    # it, which trains as the unknown id.  A corpus note must never hit it.
    unknown = {ex.note_id: sum(i == tokenizer.unk_token_id for i in ex.ids) for ex in examples}
    corpus_unknown = sum(n for note_id, n in unknown.items() if not note_id.startswith("teacher-"))
    if corpus_unknown:
        raise UserError(f"teacher training: {corpus_unknown} corpus tokens fall outside the compact table")
    device = _device(args.device or section.get("device"))
    model = build_model(arch, vocab_size=tokenizer.vocab_size, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id, seed=int(cfg["seed"]),
                        attn_implementation=cfg.get("attn_implementation", "sdpa")).to(device)
    if args.init:   # go on from a trained model of this architecture and tokenizer (a planted fine-tune)
        from safetensors.torch import load_file

        weights = Path(args.init) / "model.safetensors"
        if not weights.is_file():
            raise UserError(f"--init {args.init}: no model.safetensors there")
        missing, unexpected = model.load_state_dict(load_file(str(weights), device=str(device)), strict=False)
        tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()   # saved once, as the embedding
        if unexpected or set(missing) - tied:
            raise UserError(f"--init {args.init}: not a model of models.architectures.{role} "
                            f"(missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)})")
        model.tie_weights()
    if args.epochs is not None:
        cfg = {**cfg, "epochs": args.epochs}
    if args.max_steps is not None:
        cfg = {**cfg, "max_steps": args.max_steps}
    start = time.time()
    log = train(model, examples, cfg, planted=planted)
    seconds = time.time() - start
    model.config._attn_implementation = section.get("attn_implementation", "eager")
    out = Path(args.out or section[role])
    n_params = sum(p.numel() for p in model.parameters())
    record = provenance({"models": section}, seed=int(cfg["seed"]), device=device, seconds=round(seconds, 1),
                        n_params=n_params, n_notes=len(notes), n_examples=len(examples),
                        kinds=dict(__import__("collections").Counter(ex.kind for ex in examples)),
                        architecture=arch.as_dict(), vocab_size=tokenizer.vocab_size,
                        unknown_tokens=sum(unknown.values()),
                        torch_threads=__import__("torch").get_num_threads(),
                        planted=planted.as_dict() if planted else None, **({"init": args.init} if args.init else {}),
                        decisions=sum(len(ex.decisions) for ex in examples))
    save_model_dir(model.cpu(), tokenizer, out, {"training_log.json": {"provenance": record, "steps": log}})
    print(f"{role}: {n_params} parameters, {len(examples)} examples, {len(log)} steps, {seconds:.0f}s on {device} "
          f"-> {out}")
    return 0


def student_tokenizer(params: dict[str, Any], family: str):
    """A student of the teacher's family shares the teacher's compact table, so teacher and student
    ids and positions pair exactly (App. I: exact for Qwen3-4B); another family gets its own table."""
    from mistill.models.tokenizers import REMAP_FILE, CompactTokenizer

    section = _models(params)
    from mistill.models.architectures import TinyArchitecture

    teacher_dir = Path(section["teacher"])
    teacher_family = TinyArchitecture.from_params(section["architectures"]["teacher"]).tokenizer_family
    if teacher_family == family and (teacher_dir / REMAP_FILE).exists():
        return CompactTokenizer.load(teacher_dir)
    return demo_tokenizer(params, family)


def _student_dir(args, section: dict[str, Any], key: str) -> Path:
    """<--out-dir>/<key> when given, else the profile's models.<key> directory."""
    return Path(args.out_dir) / key if args.out_dir else Path(section[key])


def _init_student(params: dict[str, Any], key: str, attn_implementation: str):
    from mistill.models.architectures import TinyArchitecture, build_model

    section = _models(params)
    arch = TinyArchitecture.from_params(section["architectures"][key])
    tokenizer = student_tokenizer(params, arch.tokenizer_family)
    model = build_model(arch, vocab_size=tokenizer.vocab_size, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id, seed=int(section.get("student_seed", 0)),
                        attn_implementation=attn_implementation)
    return arch, tokenizer, model


def cmd_init_students(args) -> int:
    from mistill.io import provenance
    from mistill.params import load_params

    params = load_params()
    section = _models(params)
    seed = int(section.get("student_seed", 0))
    for key in ("student_qwen", "student_smol"):
        arch, tokenizer, model = _init_student(params, key, section.get("attn_implementation", "eager"))
        record = provenance({"models": section}, seed=seed, architecture=arch.as_dict(),
                            vocab_size=tokenizer.vocab_size, n_params=sum(p.numel() for p in model.parameters()))
        out = save_model_dir(model, tokenizer, _student_dir(args, section, key), {"init.json": record})
        print(f"{key}: {record['n_params']} parameters, vocab {tokenizer.vocab_size} -> {out}")
    return 0


def pretraining_notes(params: dict[str, Any], world: Any) -> list:
    """The students' pretraining notes: the world's note generator under its own seed
    (`student_pretraining.notes_seed`), patients renamed `pretrain-...`, cut as prompts are.

    They stand in for what an off-the-shelf student brings (App. J.1: Qwen3-4B and SmolLM3-3B are
    pretrained models that have never been distilled from the teacher): no corpus patient, no teacher
    trace and no RT-003 shortlist is among them."""
    from mistill.models.world_files import cut_for_prompt

    cfg = _models(params)["student_pretraining"]
    notes = generated_notes(params, world, int(cfg["patients"]), int(cfg["notes_seed"]), "pretrain",
                            what="student pretraining")
    return [cut_for_prompt(n) for n in notes]


def cmd_pretrain_students(args) -> int:
    """Seeded init, then next-token training on scripted traces of the pretraining notes
    (mistill.models.train_teacher.train, the teacher's recipe with the students' own budget)."""
    from collections import Counter

    import torch

    from mistill.io import provenance
    from mistill.models.train_teacher import build_examples, train
    from mistill.models.world_files import load_world
    from mistill.params import load_params

    params = load_params()
    section = _models(params)
    cfg = section.get("student_pretraining")
    keys = args.students.split(",") if args.students else ["student_qwen", "student_smol"]
    if not cfg:
        if _loaded_by_id(section, keys):  # the paper profile: nothing to pretrain, only pins to write
            _write_pins(section, keys)
            return 0
        raise UserError("params: models.student_pretraining is not set for this profile, and a student is a local "
                        "directory: set student_pretraining or point the students at model ids")
    unknown = [k for k in keys if k not in (cfg.get("epochs") or {})]
    if unknown:
        raise UserError(f"student_pretraining.epochs has no entry for {', '.join(unknown)}")
    near_misses = cfg.get("near_misses", True)
    if not isinstance(near_misses, bool):
        raise UserError(f"student_pretraining.near_misses must be true or false, got {near_misses!r}")
    set_threads(section)
    world = load_world(params)
    notes = pretraining_notes(params, world)
    device = _device(args.device or section.get("device"))
    for key in keys:
        arch, tokenizer, model = _init_student(params, key, cfg.get("attn_implementation", "sdpa"))
        examples = build_examples(tokenizer, world, notes, seed=int(cfg["seed"]),
                                  shortlist_share=float(cfg["shortlist_share"]),
                                  shortlist_size=int(cfg["shortlist_size"]), near_misses=near_misses)
        epochs = int(args.epochs if args.epochs is not None else cfg["epochs"][key])
        run_cfg = {**cfg, "epochs": epochs, "max_steps": args.max_steps}
        start = time.time()
        log = train(model.to(device), examples, run_cfg, desc=key)
        seconds = time.time() - start
        model.config._attn_implementation = section.get("attn_implementation", "eager")
        record = provenance({"models": section}, seed=int(cfg["seed"]), device=device, seconds=round(seconds, 1),
                            architecture=arch.as_dict(), vocab_size=tokenizer.vocab_size,
                            n_params=sum(p.numel() for p in model.parameters()), n_notes=len(notes),
                            n_examples=len(examples), epochs=epochs,
                            kinds=dict(Counter(ex.kind for ex in examples)),
                            unknown_tokens=sum(i == tokenizer.unk_token_id for ex in examples for i in ex.ids),
                            torch_threads=torch.get_num_threads())
        out = _student_dir(args, section, key)
        save_model_dir(model.cpu(), tokenizer, out, {"pretraining_log.json": {"provenance": record, "steps": log}})
        print(f"{key}: {record['n_params']} parameters, {len(examples)} examples, {len(log)} steps, "
              f"final loss {log[-1]['loss']:.3f}, {seconds:.0f}s on {device} -> {out}")
    return 0


def cmd_traces(args) -> int:
    import torch

    from mistill.io import write_json
    from mistill.models.traces import TRACE_SETS, run_trace_set
    from mistill.params import load_params

    if args.set not in TRACE_SETS:
        raise UserError(f"unknown trace set {args.set!r}; known: {', '.join(TRACE_SETS)}")
    start = time.perf_counter()
    params = load_params()
    section = _models(params)
    set_threads(section)
    backend = section.get("generation_backend", "transformers")
    device = _device(args.device or section.get("device")) if backend == "transformers" else "vllm"
    run = run_trace_set(params, args.set, spec=args.model or section["teacher"], device=device, limit=args.limit,
                        batch=args.batch)
    if not run.summary:   # another engine's process under torchrun: rank 0 reports
        return 0
    # where and how fast: uncached and undeclared, so the hashed outputs are the same on every machine
    write_json(run.path.with_name("timing.json"), {
        "seconds": round(time.perf_counter() - start, 1), "computed": run.computed, "reused": run.reused,
        "device": device, "torch_threads": torch.get_num_threads()})
    overall = run.summary["overall"]
    print(f"{args.set}: {run.computed} notes computed, {run.reused} reused")
    print(f"{args.set}: {overall['notes']} notes, valid {overall['valid_rate']:.2f}, "
          f"micro-F1 {overall['teacher']['micro_f1']:.3f} -> {run.path}")
    return 0


def register(subparsers) -> None:
    sub = subparsers.add_parser("train-teacher", help="train the tiny demo teacher on scripted traces")
    sub.add_argument("--device", help="cpu, cuda or auto (default: params models.device)")
    sub.add_argument("--epochs", type=int, help="override models.teacher_training.epochs")
    sub.add_argument("--max-steps", type=int, help="stop after N optimiser steps (smoke runs, timing)")
    sub.add_argument("--init", help="start from this trained model directory (same architecture and tokenizer) "
                                    "instead of a fresh initialisation")
    sub.add_argument("--out", help="output directory (default: params models.<role>)")
    sub.add_argument("--role", default="teacher",
                     help="the params models key to train: teacher, or teacher_qwq (R-C15's second teacher)")
    sub.set_defaults(func=cmd_train_teacher)

    sub = subparsers.add_parser("init-students", help="seeded random initialisation of the demo students")
    sub.add_argument("--out-dir", help="write <out-dir>/<student key>/ instead of params models.<key>")
    sub.set_defaults(func=cmd_init_students)

    sub = subparsers.add_parser("pretrain-students",
                                help="pretrain the demo students on scripted traces of their own notes")
    sub.add_argument("--students", help="comma list of params models keys (default: student_qwen,student_smol)")
    sub.add_argument("--device", help="cpu, cuda or auto (default: params models.device)")
    sub.add_argument("--epochs", type=int, help="override student_pretraining.epochs for every student")
    sub.add_argument("--max-steps", type=int, help="stop after N optimiser steps (smoke runs, timing)")
    sub.add_argument("--out-dir", help="write <out-dir>/<student key>/ instead of params models.<key>")
    sub.set_defaults(func=cmd_pretrain_students)

    sub = subparsers.add_parser("traces", help="teacher traces of one trace set (TR-006, TR-007, TR-008, TR-A, TR-QWQ)")
    sub.add_argument("--set", required=True, help="TR-006, TR-007, TR-008, TR-A (R-C14: the instruction control) or "
                     "TR-QWQ (R-C15: the second teacher, with --model)")
    sub.add_argument("--model", help="model id or directory (default: params models.teacher)")
    sub.add_argument("--device", help="cpu, cuda or auto (default: params models.device)")
    sub.add_argument("--limit", type=int, help="only the first N notes (smoke runs)")
    sub.add_argument("--batch", type=int, default=16,
                     help="notes sampled together by the transformers backend (each keeps its own seed's stream)")
    # one process per vLLM engine (params models.vllm.data_parallel_size; mistill.shard)
    sub.set_defaults(func=cmd_traces, sharded=generation_processes)
