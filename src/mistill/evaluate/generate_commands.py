"""`mistill evaluate generate`: one arm's generations on the test notes (App. J.5, K).

Each test note's shortlist prompt is sampled once with the teacher's decoding settings and a
per-note seed independent of the training seed (App. J.5: "a per-note seed"):

    seed(note) = seeds.decoding + crc32(note_id) mod 2^31

so a note's seed does not depend on which other notes are generated or in what order. Notes are
decoded in left-padded batches, each row from its own seeded generator
(`mistill.models.sampling`), so batching does not couple the rows' randomness. The
records have the trace format of TR-008 (`note_id, prompt, completion, valid, hit_cap,
degenerate, answer, n_new_tokens, seed, decoding, model`), which `mistill evaluate task` and
`fidelity --generations` read. The pass is resumable per note, under `dvc repro` too
(`mistill.models.trace_rows`): a record is kept only when its `input_sha256` (the model's
fingerprint, prompt, decoding, seed) matches. Under the vllm backend with
`models.vllm.data_parallel_size` N the command runs as N processes under torchrun, one engine
each, note n on process n mod N (`mistill.models.vllm_backend`).

Hooked into `mistill evaluate` by `mistill.evaluate.commands.register`.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from mistill.errors import UserError
from mistill.models.vllm_backend import generation_processes


def note_seed(base_seed: int, note_id: str) -> int:
    """The per-note sampling seed: base + crc32(note_id), folded into [0, 2^31)."""
    return (int(base_seed) + zlib.crc32(note_id.encode("utf-8"))) % (2 ** 31)


def cmd_generate(args) -> int:
    from tqdm import tqdm

    from mistill.io import provenance, write_json
    from mistill.models.decoding import Decoding
    from mistill.models.fingerprint import model_fingerprint
    from mistill.models.generation import generate
    from mistill.models.loading import ModelSpec, load_model, set_threads
    from mistill.models.trace_rows import ResumableRows, input_key
    from mistill.models.world_files import SHORTLIST, load_world
    from mistill.params import load_params
    from mistill.shard import Shard
    from mistill.world.answers import parse_answer
    from mistill.world.notes import load_notes

    params = load_params()
    models = params["models"]
    set_threads(models, args.threads)
    spec = str(params["models"].get(args.model, args.model))
    if not Path(spec).exists() and "/" not in spec:
        raise UserError(f"--model {args.model!r}: neither a params models key nor a model directory or id")
    world = load_world(params, need_shortlists=True)
    notes_path = Path(args.notes or params["evaluate"]["test_notes"])
    if not notes_path.exists():
        raise UserError(f"{notes_path}: no test notes (run `mistill world corpora`)")
    notes = load_notes(notes_path, world.inventory)[:args.limit]
    decoding = Decoding.from_params(params["decoding"])
    base_seed = int(params["seeds"]["decoding"])
    attn = models.get("generation_attn_implementation") or models.get("attn_implementation", "eager")
    backend = models.get("generation_backend", "transformers")
    settings = {**decoding.as_dict(), "backend": backend, "attn_implementation": attn}
    out = Path(args.out)
    model_spec = ModelSpec.from_params(models, spec, attn_implementation=attn)
    model_sha256 = model_fingerprint(model_spec)  # its files, dtype and YaRN: a model retrained in place differs
    prompts = {n.note_id: world.prompt(n, SHORTLIST) for n in notes}
    seeds = {n.note_id: note_seed(base_seed, n.note_id) for n in notes}
    # resumable per note, under `dvc repro` too: a row is reused only under the same input key
    rows = ResumableRows(out, {n.note_id: input_key(model_sha256=model_sha256, prompt=prompts[n.note_id],
                                                     decoding=settings, seed=seeds[n.note_id])
                               for n in notes},
                         shard=Shard.from_env())   # under torchrun: this engine's notes (vllm data parallel)
    todo_ids = set(rows.todo())
    todo = [n for n in notes if n.note_id in todo_ids]
    if todo:
        if backend == "vllm":  # App. J.5: every arm generates in vLLM, one engine for every batch
            from mistill.models.vllm_backend import VLLMGenerator

            engine = VLLMGenerator.from_params(models, model_spec)
            sample = lambda ps, ss: [g.as_dict() for g in engine.generate(ps, ss, decoding)]
        else:
            model, tokenizer = load_model(model_spec)
            sample = lambda ps, ss: [g.as_dict() for g in generate((model, tokenizer), ps, seeds=ss, decoding=decoding,
                                                                   batch_size=len(ps))]
        batches = [todo[i:i + int(args.batch)] for i in range(0, len(todo), int(args.batch))]
        with rows:
            for group in tqdm(batches, desc=f"generate {out.parent.name}", unit="batch"):
                batch_prompts = [prompts[n.note_id] for n in group]
                batch_seeds = [seeds[n.note_id] for n in group]
                for note, prompt, seed, gen in zip(group, batch_prompts, batch_seeds,
                                                   sample(batch_prompts, batch_seeds)):
                    parsed = parse_answer(gen["completion"], world.inventory, hit_cap=gen["hit_cap"])
                    rows.add({
                        "note_id": note.note_id, "prompt": prompt, "completion": gen["completion"],
                        "valid": parsed.valid, "hit_cap": parsed.hit_cap, "degenerate": parsed.degenerate,
                        "answer": list(parsed.answer), "n_new_tokens": gen["n_new_tokens"], "seed": seed,
                        "decoding": settings, "model": spec, "model_sha256": model_sha256,
                    })
    records = rows.finish()
    if not rows.shard.leader:   # another engine's process: rank 0 writes the summary
        return 0
    write_json(out.with_name(out.stem + ".summary.json"), {
        "notes": len(records), "valid_rate": sum(r["valid"] for r in records) / max(len(records), 1),
        "hit_cap_share": sum(r["hit_cap"] for r in records) / max(len(records), 1),
        "n_new_tokens": sum(r["n_new_tokens"] for r in records), "model": spec, "test_notes": str(notes_path),
        "provenance": provenance({"decoding": params["decoding"], "seeds": params["seeds"]}, seed=base_seed,
                                 seed_rule="seeds.decoding + crc32(note_id) mod 2^31", model=spec)})
    print(f"generate: {len(records)} notes ({rows.computed} computed, {rows.reused} reused), "
          f"valid {sum(r['valid'] for r in records)}/{len(records)} -> {out}")
    return 0


def cmd_notes_with_events(args) -> int:
    """Write the notes whose teacher trace has an events file; name the others and why they have none.

    The events pass skips a trace that names a code outside the inventory (params
    instrument.events.unknown_codes: skip_note) and records why in skipped_events.json; the
    consumers of events (teacher targets, M1) refuse a note without events, so the chain drops
    such notes here, visibly, instead of training or scoring on a partial set by accident.
    """
    import json

    from mistill.io import atomic_open, iter_json_lines, read_json

    events_dir = Path(args.events_dir)
    if not events_dir.is_dir():
        raise UserError(f"{events_dir}: no events directory (run `mistill instrument events` first)")
    skipped_path = events_dir / "skipped_events.json"
    why = read_json(skipped_path, "skipped notes").get("skipped", {}) if skipped_path.exists() else {}
    kept, dropped = [], {}
    for where, row in iter_json_lines(args.notes, "notes"):
        if not isinstance(row, dict) or not isinstance(row.get("note_id"), str):
            raise UserError(f"{where}: a note row needs a note_id")
        note_id = row["note_id"]
        if (events_dir / note_id / "events.jsonl").is_file():
            kept.append(json.dumps(row, ensure_ascii=False))
        else:
            dropped[note_id] = why.get(note_id, "no events file")
    if not kept:
        raise UserError(f"{args.notes}: no note has events under {events_dir}")
    with atomic_open(args.out) as fh:
        fh.write("".join(f"{line}\n" for line in kept))
    print(f"notes with events: {len(kept)} kept, {len(dropped)} dropped"
          + "".join(f"; {n}: {r}" for n, r in sorted(dropped.items())))
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("generate", help="one arm's test-note generations, teacher decoding, per-note seeds")
    p.add_argument("--model", required=True, help="params models key (student_qwen, ...) or a model directory")
    p.add_argument("--out", required=True, help="generations jsonl (trace format); a .summary.json goes beside it")
    p.add_argument("--notes", help="notes to generate on (default: params evaluate.test_notes)")
    p.add_argument("--limit", type=int, help="only the first N notes (smoke runs)")
    p.add_argument("--batch", type=int, default=32, help="notes decoded together (rows keep their own seeds)")
    p.add_argument("--threads", type=int, help="intra-op threads (default: params models.threads)")
    p.set_defaults(func=cmd_generate, sharded=generation_processes)   # one process per vLLM engine

    p = subparsers.add_parser("notes-with-events", help="the notes whose teacher trace has events (targets, M1)")
    p.add_argument("--notes", required=True, help="notes jsonl to filter")
    p.add_argument("--events-dir", required=True, help="<note_id>/events.jsonl directory of the teacher's traces")
    p.add_argument("--out", required=True, help="filtered notes jsonl")
    p.set_defaults(func=cmd_notes_with_events)
