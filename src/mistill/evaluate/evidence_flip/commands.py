"""`mistill evaluate ef-cohort | ef-authored` (App. N.2: the evidence-flip population; R-D35).

    ef-cohort    lock -> draw -> retriever and shortlist -> teacher screen -> proposals -> review selection
                 -> <evidence_flip.out_dir>/cohort/
    ef-authored  the reviewed proposals' authored flips and controls -> approval ledger -> cohort_row.json
                 -> <evidence_flip.out_dir>/cases/

Every step freezes what it wrote (its directory's FROZEN.json) and verifies what it reads, the other
directory's files included; a step whose outputs are already frozen (and unchanged) is not run again,
so a killed run resumes and a frozen cohort is never silently redrawn (to redraw, remove the
directory; `dvc repro` does, for a stage whose inputs changed).  Hooked into
`mistill evaluate` by `mistill.evaluate.commands.register`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mistill.errors import UserError


@dataclass(frozen=True)
class FlipSettings:
    """The profile's `evidence_flip` section beside its locked rules."""

    out_dir: Path
    development: tuple[str, ...]     # corpora files (under <artifacts>/data) whose patients are never drawn
    excluded_splits: tuple[str, ...]  # the retriever's and the teacher's training split
    authoring: str                   # "generator", or the directory of the author's case files
    approval: str                    # "rule", or the author's approval ledger (CSV: case, decision, reason)

    @property
    def cohort_dir(self) -> Path:
        """LOCK.json and the frozen draw, shortlists, screen, attempts and review selection."""
        return self.out_dir / "cohort"

    @property
    def cases_dir(self) -> Path:
        """The authored cases, the approval ledger and cohort_row.json, frozen in their own FROZEN.json."""
        return self.out_dir / "cases"

    @classmethod
    def from_params(cls, params: dict) -> FlipSettings:
        section = params.get("evidence_flip")
        where = f"params.yaml {params.get('name', '<profile>')}.evidence_flip"
        if not isinstance(section, dict):
            raise UserError(f"{where}: missing; it names the cohort directory, its rules and its authoring")
        try:
            return cls(Path(section["out_dir"]), tuple(section["development"]), tuple(section["excluded_splits"]),
                       str(section["authoring"]), str(section["approval"]))
        except KeyError as err:
            raise UserError(f"{where}: missing {err.args[0]}") from None


def _params():
    from mistill.params import load_params

    return load_params()


def _step_done(root: Path, stage: str, outputs: list[Path]) -> bool:
    """Whether `stage` froze exactly these outputs and they are unchanged (then it is not run again)."""
    from mistill.evaluate.evidence_flip.freeze import FROZEN, verify
    from mistill.io import read_json

    ledger = root / FROZEN
    if not ledger.exists() or stage not in read_json(ledger, "frozen stages"):
        return False
    verify(root, outputs)
    return True


def cmd_ef_cohort(args) -> int:
    from tqdm import tqdm

    from mistill.evaluate.evidence_flip import cohort as ch
    from mistill.evaluate.evidence_flip.authoring import evidence_spans
    from mistill.evaluate.evidence_flip.freeze import freeze, verify, write_lock
    from mistill.io import provenance, read_json, read_jsonl, write_json, write_jsonl
    from mistill.models.decoding import Decoding
    from mistill.models.fingerprint import model_fingerprint
    from mistill.models.generation import generate
    from mistill.models.loading import ModelSpec, load_model
    from mistill.models.world_files import cut_for_prompt, data_dir
    from mistill.world.inventory import format_line, load_inventory
    from mistill.world.notes import load_notes, note_from_row, note_to_row
    from mistill.world.prompt import build_prompt
    from mistill.world.shortlist import Retriever, RetrieverConfig, build_shortlist, retriever_training_notes

    params = _params()
    settings = FlipSettings.from_params(params)
    rules = ch.CohortRules.from_params(params)
    root = settings.cohort_dir
    root.mkdir(parents=True, exist_ok=True)
    write_lock(root, rules.as_dict())
    data = data_dir(params)
    inventory = load_inventory(data / "inventory.jsonl")
    draw_path, shortlist_path, screen_path = root / "draw.jsonl", root / "shortlists.jsonl", root / "screen.jsonl"
    attempts_path, selection_path = root / "attempts.jsonl", root / "selection.json"

    development = {n.patient_id for name in settings.development for n in load_notes(data / name, inventory)}
    if not _step_done(root, "draw", [draw_path]):
        pool = load_notes(data / "notes.jsonl", inventory)
        drawn = ch.draw_patients(pool, development, set(settings.excluded_splits), rules.n_patients, rules.seed)
        write_jsonl(draw_path, [note_to_row(cut_for_prompt(n)) for n in drawn])
        freeze(root, "draw", [draw_path])
    verify(root, [draw_path])
    drawn = [note_from_row(row, f"{draw_path}:{i}") for i, row in enumerate(read_jsonl(draw_path), start=1)]

    if not _step_done(root, "shortlist", [shortlist_path]):
        section = params["world"]["shortlist"]
        pool = load_notes(data / "notes.jsonl", inventory)
        held_out = development | {n.patient_id for n in drawn}      # retrained without the drawn patients
        train = retriever_training_notes(pool, split=str(section["train_split"]), exclude_patients=held_out)
        retriever = Retriever(inventory, RetrieverConfig.from_params(section)).fit(train)
        k = int(read_json(data / "shortlists_recall.json", "stored shortlists' report")["k"])
        rows = [{"note_id": n.note_id, "k": k, "n_retriever_train_notes": len(train),
                 "codes": build_shortlist(retriever.ranking(n), inventory, k=k, sibling_top=int(section["sibling_top"]))}
                for n in tqdm(drawn, desc="evidence flip: shortlists", unit="note")]
        write_jsonl(shortlist_path, rows)
        freeze(root, "shortlist", [shortlist_path])
    verify(root, [shortlist_path])
    shortlists = {r["note_id"]: r["codes"] for r in read_jsonl(shortlist_path)}

    models = params["models"]
    attn = models.get("generation_attn_implementation") or models.get("attn_implementation", "eager")
    spec = ModelSpec.from_params(models, models["teacher"], base="teacher", attn_implementation=attn)
    teacher_sha256 = model_fingerprint(spec)
    if _step_done(root, "screen", [screen_path]):
        made_by = {r.get("model_sha256") for r in read_jsonl(screen_path)}
        if made_by and made_by != {teacher_sha256}:
            raise UserError(f"{screen_path}: frozen screen of another teacher; the cohort stays as frozen "
                            f"(remove {root} to redraw it under the current teacher)")
    else:
        prompts = {n.note_id: build_prompt(n, [format_line(c) for c in inventory.restrict(shortlists[n.note_id])])
                   for n in drawn}
        seed = int(params["seeds"]["decoding"])
        backend = models.get("generation_backend", "transformers")
        from mistill.models.vllm_backend import EngineSettings

        runner = load_model(spec, device=args.device) if backend == "transformers" else spec
        generations = generate(runner, [prompts[n.note_id] for n in drawn], seeds=[seed] * len(drawn),
                               backend=backend, engine=EngineSettings.from_params(models, spec.name),
                               decoding=Decoding.from_params(params["decoding"]), progress=True)
        write_jsonl(screen_path, [{"note_id": n.note_id, "completion": g.completion, "hit_cap": g.hit_cap,
                                   "seed": g.seed, "model_sha256": teacher_sha256} for n, g in zip(drawn, generations)])
        freeze(root, "screen", [screen_path])
    verify(root, [screen_path])
    screens = {r["note_id"]: r["completion"] for r in read_jsonl(screen_path)}

    if not _step_done(root, "proposals", [attempts_path, selection_path]):
        attempts = [a for n in drawn for a in ch.attempts_for(n, screens[n.note_id], inventory, rules.pairing,
                                                              lambda note, code: evidence_spans(note, code, inventory))]
        proposals = ch.proposals_in_draw_order(drawn, attempts)
        write_jsonl(attempts_path, ch.as_rows(attempts))
        write_json(selection_path, {"reviewed": ch.as_rows(proposals[:rules.review_budget]),
                                    "accounting": ch.accounting(drawn, attempts, rules.review_budget),
                                    "provenance": provenance(params, rules.seed)})
        freeze(root, "proposals", [attempts_path, selection_path])
    verify(root, [attempts_path, selection_path])
    counts = read_json(selection_path, "review selection")["accounting"]
    print("evidence flip: " + ", ".join(f"{k} {v}" for k, v in counts.items() if not isinstance(v, dict))
          + f" -> {root}")
    return 0


def cmd_ef_authored(args) -> int:
    from mistill.evaluate.evidence_flip import authoring, ledger
    from mistill.evaluate.evidence_flip.cohort import CohortRules, from_rows
    from mistill.evaluate.evidence_flip.freeze import check_lock, freeze, verify
    from mistill.io import read_json, read_jsonl, write_json
    from mistill.models.world_files import data_dir
    from mistill.world.inventory import load_inventory
    from mistill.world.notes import note_from_row

    params = _params()
    settings = FlipSettings.from_params(params)
    rules = CohortRules.from_params(params)
    cohort, root = settings.cohort_dir, settings.cases_dir
    check_lock(cohort, rules.as_dict())
    draw_path, selection_path = cohort / "draw.jsonl", cohort / "selection.json"
    verify(cohort, [draw_path, selection_path])
    inventory = load_inventory(data_dir(params) / "inventory.jsonl")
    notes = {r["note_id"]: note_from_row(r, str(draw_path)) for r in read_jsonl(draw_path)}
    selection = read_json(selection_path, "review selection")
    reviewed = from_rows(selection["reviewed"])
    cases_dir = root / "authored"
    if settings.authoring == "generator":
        cases = ledger.generator_cases(reviewed, notes, inventory, seed=rules.seed)
        paths = ledger.write_cases(cases_dir, cases)
    else:
        paths = ledger.import_cases(Path(settings.authoring), cases_dir, reviewed)
        cases = [authoring.Case(**read_json(p, "authored case")) for p in paths]
    freeze(root, "authored", paths)
    verify(root, paths)
    ledger_path = root / "approval_ledger.csv"
    if settings.approval == "rule":
        decisions = {c.case: authoring.approve(c, notes[c.note_id], inventory) for c in cases}
        ledger.write_ledger(ledger_path, decisions)
    else:
        ledger.import_ledger(Path(settings.approval), ledger_path, [c.case for c in cases])
    freeze(root, "approval", [ledger_path])
    verify(root, [ledger_path])
    row = ledger.reconcile(selection["accounting"], ledger.read_ledger(ledger_path, [c.case for c in cases]), cases)
    write_json(root / "cohort_row.json", row)
    freeze(root, "reconciliation", [root / "cohort_row.json"])
    print("evidence flip: " + ", ".join(f"{k} {v}" for k, v in row.items() if not isinstance(v, dict | list))
          + f" -> {root / 'cohort_row.json'}")
    return 0


def accepted_cases(settings: FlipSettings) -> list[dict]:
    """The accepted cases' files, each verified against the frozen authoring stage."""
    from mistill.evaluate.evidence_flip.freeze import verify
    from mistill.io import read_json

    root = settings.cases_dir
    row_path = root / "cohort_row.json"
    verify(root, [row_path])
    paths = [root / "authored" / f"{case}.json" for case in read_json(row_path, "cohort reconciliation")["accepted_cases"]]
    verify(root, paths)
    return [read_json(p, "authored case") for p in paths]


def primary_arm(params: dict, objective: str, seed: int) -> str:
    """The answers' label (`<out_dir>/gen/<label>`, the EF-generate-* stages' --arm) of one checkpoint of the
    locked primary pair: params evidence_flip's student at its precision, `objective` mistill or vanilla."""
    section = params["evidence_flip"]
    return f"student-{section['student']}-{objective}-{section['precision']}-s{seed}"


def case_inputs(params: dict, settings: FlipSettings):
    """(inventory, accepted cases, candidate lines per case) for the stages that answer the cases: the drawn
    note's shortlist with B added where the retriever left it out, the same lines under every condition."""
    from mistill.evaluate.evidence_flip.freeze import verify
    from mistill.io import read_jsonl
    from mistill.models.world_files import data_dir
    from mistill.world.inventory import format_line, load_inventory

    inventory = load_inventory(data_dir(params) / "inventory.jsonl")
    shortlist_path = settings.cohort_dir / "shortlists.jsonl"
    verify(settings.cohort_dir, [shortlist_path])
    shortlists = {r["note_id"]: r["codes"] for r in read_jsonl(shortlist_path)}
    cases = accepted_cases(settings)
    lines = {c["case"]: [format_line(code) for code in inventory.restrict({*shortlists[c["note_id"]], c["partner"]})]
             for c in cases}
    return inventory, cases, lines


def cmd_ef_generate(args) -> int:
    """One checkpoint's answers to every accepted case under every condition (App. N.1, N.3; R-D33)."""
    from tqdm import tqdm

    from mistill.evaluate.evidence_flip.behaviour import CONDITIONS
    from mistill.evaluate.evidence_flip.cohort import CohortRules
    from mistill.evaluate.generate_commands import note_seed
    from mistill.models.decoding import Decoding
    from mistill.models.fingerprint import model_fingerprint
    from mistill.models.generation import generate
    from mistill.models.loading import ModelSpec, load_model, set_threads
    from mistill.models.trace_rows import ResumableRows, input_key
    from mistill.models.vllm_backend import EngineSettings
    from mistill.world.answers import parse_answer
    from mistill.world.prompt import build_prompt

    params = _params()
    settings = FlipSettings.from_params(params)
    rules = CohortRules.from_params(params)
    models = params["models"]
    set_threads(models, args.threads)
    inventory, cases, lines = case_inputs(params, settings)
    attn = models.get("generation_attn_implementation") or models.get("attn_implementation", "eager")
    spec = ModelSpec.from_params(models, str(models.get(args.model, args.model)), base=args.base,
                                 attn_implementation=attn)
    model_sha256 = model_fingerprint(spec)
    decoding = Decoding.from_params(params["decoding"])
    base_seed = int(params["seeds"]["decoding"])
    jobs = {}
    for case in cases:
        for condition in CONDITIONS:
            prompt = build_prompt(case["texts"][condition], lines[case["case"]])
            for sample in range(rules.samples):
                seed = note_seed(base_seed, f"{case['case']}:{sample}")   # shared by conditions and checkpoints
                jobs[f"{case['case']}:{condition}:{sample}"] = (case, condition, sample, prompt, seed)
    out = settings.out_dir / "gen" / args.arm / "generations.jsonl"
    rows = ResumableRows(out, {key: input_key(model_sha256=model_sha256, prompt=job[3], decoding=decoding.as_dict(),
                                              seed=job[4]) for key, job in jobs.items()})
    todo = rows.todo()
    if todo:
        runner = load_model(spec) if models.get("generation_backend", "transformers") == "transformers" else spec
        batches = [todo[i:i + args.batch] for i in range(0, len(todo), args.batch)]
        with rows:
            for batch in tqdm(batches, desc=f"evidence flip: {args.arm}", unit="batch"):
                generations = generate(runner, [jobs[k][3] for k in batch], seeds=[jobs[k][4] for k in batch],
                                       backend=models.get("generation_backend", "transformers"), decoding=decoding,
                                       engine=EngineSettings.from_params(models, spec.name), batch_size=len(batch))
                for key, gen in zip(batch, generations):
                    case, condition, sample, prompt, seed = jobs[key]
                    parsed = parse_answer(gen.completion, inventory, hit_cap=gen.hit_cap)
                    rows.add({"note_id": key, "case": case["case"], "condition": condition, "sample": sample,
                              "completion": gen.completion, "valid": parsed.valid, "hit_cap": gen.hit_cap,
                              "answer": list(parsed.answer), "seed": seed, "model": args.arm,
                              "model_sha256": model_sha256})
    records = rows.finish()
    print(f"evidence flip: {args.arm}: {len(records)} answers ({rows.computed} computed, {rows.reused} reused), "
          f"valid {sum(r['valid'] for r in records)}/{len(records)} -> {out}")
    return 0


def cmd_ef_keymask(args) -> int:
    """One nominated head set's answers with a decode-time key mask on evidence or sham keys (App. N.4; R-D34)."""
    from tqdm import tqdm

    from mistill.evaluate.evidence_flip import causal
    from mistill.evaluate.evidence_flip.cohort import CohortRules
    from mistill.evaluate.generate_commands import note_seed
    from mistill.instrument.keymask import decode_key_mask
    from mistill.io import write_json
    from mistill.models.decoding import Decoding, completion_of
    from mistill.models.fingerprint import model_fingerprint
    from mistill.models.loading import ModelSpec, load_model, set_threads
    from mistill.models.sampling import sample_rows
    from mistill.models.trace_rows import ResumableRows, input_key
    from mistill.world.answers import parse_answer
    from mistill.world.prompt import build_prompt

    params = _params()
    settings = FlipSettings.from_params(params)
    rules = CohortRules.from_params(params)
    section = params["evidence_flip"].get("causal") or {}
    where = f"params.yaml {params.get('name', '<profile>')}.evidence_flip.causal.sets.{args.set}"
    spec_row = (section.get("sets") or {}).get(args.set)
    if not isinstance(spec_row, dict):
        raise UserError(f"{where}: no such head set")
    models = params["models"]
    set_threads(models, args.threads)
    inventory, cases, lines = case_inputs(params, settings)
    # the HF path on every profile: the mask needs the model's own attention layers
    spec = ModelSpec.from_params(models, str(models.get(spec_row["model"], spec_row["model"])),
                                 base=spec_row.get("base", "teacher"), attn_implementation="sdpa")
    model, tokenizer = load_model(spec)
    heads = causal.nominated_heads(spec_row, params, model.config.num_hidden_layers,
                                   model.config.num_attention_heads, where)
    model_sha256 = model_fingerprint(spec)
    decoding = Decoding.from_params(params["decoding"])
    base_seed = int(params["seeds"]["decoding"])
    conditions = list(section.get("conditions") or ["original", "flipped"])
    jobs = {}
    for case in cases:
        for condition in conditions:
            text = case["texts"][condition]
            prompt = build_prompt(text, lines[case["case"]])
            evidence = case["evidence"]["flipped" if condition == "flipped" else "original"] \
                if condition in ("original", "flipped") else []
            keys = causal.row_keys(tokenizer, prompt, text, evidence, f"{rules.seed}:{case['case']}:{condition}")
            for sample in range(rules.samples):
                jobs[(case["case"], condition, sample)] = (prompt, note_seed(base_seed, f"{case['case']}:{sample}"), keys)
    masks = [m for m in causal.MASKS if m != "clean" or spec_row.get("clean", True)]
    out_dir = settings.out_dir / "hf" / args.set
    summary = {"heads": [list(h) for h in heads], "conditions": conditions, "masks": masks, "keys": {}}
    for mask in masks:
        keyed = {f"{c}:{cond}:{j}": job for (c, cond, j), job in jobs.items()}
        rows = ResumableRows(out_dir / mask / "generations.jsonl", {
            k: input_key(model_sha256=model_sha256, prompt=job[0], decoding=decoding.as_dict(), seed=job[1],
                         heads=summary["heads"] if mask != "clean" else [],
                         keys=list(getattr(job[2], mask)) if mask != "clean" else [])
            for k, job in keyed.items()})
        todo = rows.todo()
        with rows:
            for start in tqdm(range(0, len(todo), args.batch), desc=f"key mask {args.set} {mask}", unit="batch"):
                batch = todo[start:start + args.batch]
                context = None if mask == "clean" else decode_key_mask(
                    model, heads, [getattr(keyed[k][2], mask) for k in batch])
                sampled = sample_rows(model, tokenizer, [keyed[k][0] for k in batch], [keyed[k][1] for k in batch],
                                      decoding, decode_context=context)
                for key, new_ids in zip(batch, sampled):
                    case_id, condition, sample = key.split(":")
                    gen = completion_of(keyed[key][0], new_ids, tokenizer, keyed[key][1])
                    parsed = parse_answer(gen.completion, inventory, hit_cap=gen.hit_cap)
                    rows.add({"note_id": key, "case": case_id, "condition": condition, "sample": int(sample),
                              "completion": gen.completion, "valid": parsed.valid, "hit_cap": gen.hit_cap,
                              "seed": keyed[key][1], "mask": mask, "model_sha256": model_sha256})
        rows.finish()
    summary["keys"] = {f"{c}:{cond}": {"target": len(job[2].target), "sham": len(job[2].sham)}
                       for (c, cond, j), job in jobs.items() if j == 0}
    write_json(out_dir / "masks.json", summary)
    print(f"evidence flip: key mask {args.set}: {len(heads)} heads, {len(jobs)} answers per mask "
          f"({', '.join(masks)}) -> {out_dir}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("ef-keymask", help="one nominated head set's evidence-flip answers under a decode-time "
                                                 "key mask (App. N.4)")
    p.add_argument("--set", required=True, help="a head set of params evidence_flip.causal.sets")
    p.add_argument("--batch", type=int, default=16, help="prompts sampled together (changes the time, never an answer)")
    p.add_argument("--threads", type=int, help="intra-op threads (default: params models.threads)")
    p.set_defaults(func=cmd_ef_keymask)

    p = subparsers.add_parser("ef-generate", help="one checkpoint's answers to the evidence-flip cases under every "
                                                  "condition (App. N.3)")
    p.add_argument("--arm", required=True, help="the checkpoint's label (its directory under <out_dir>/gen)")
    p.add_argument("--model", required=True, help="a params models key, or a checkpoint directory or id")
    p.add_argument("--base", default="teacher", help="the params models key the checkpoint descends from (its YaRN)")
    p.add_argument("--batch", type=int, default=16, help="prompts sampled together (changes the time, never an answer)")
    p.add_argument("--threads", type=int, help="intra-op threads (default: params models.threads)")
    p.set_defaults(func=cmd_ef_generate)
    p = subparsers.add_parser("ef-cohort", help="the evidence-flip population: lock, draw, shortlist, screen, "
                                                "proposals (App. N.2)")
    p.add_argument("--device", default=None, help="the teacher's device (default: cuda when available)")
    p.set_defaults(func=cmd_ef_cohort)
    p = subparsers.add_parser("ef-authored", help="the evidence-flip cases: authored flips, approval ledger, "
                                                  "accounting (App. N.2)")
    p.set_defaults(func=cmd_ef_authored)
