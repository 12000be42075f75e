"""Teacher trace sets TR-006 / TR-007 / TR-008 (App. A, B, Q).

* TR-006: the characterization notes on the full-inventory prompt (HD-001).
* TR-007: the same notes on their shortlists (HD-002; the validation set).
* TR-008: the distillation corpus (train and test notes) on their shortlists.
* TR-A: R-C14's instruction control (App. B): a seeded draw of the characterization notes
  (params `instruction_control.notes`, `.seed`) on the full-inventory prompt without the
  narrow-then-decide sentence, nothing else changed.
* TR-QWQ: R-C15's second teacher (App. H) on TR-006's notes and prompt (`--model` names it).

One record per note, in the trace-record contract (`artifacts/<set>/traces.jsonl`):
the untemplated prompt, the completion after the assistant header, App. K's
validity / cap / degenerate flags and answer, the token count, the seed, the
decoding settings, the model and its checkpoint's sha256.  The pass is resumable
per note, under `dvc repro` too (`mistill.models.trace_rows`): a record is kept only
when its `input_sha256` (the model's fingerprint, prompt, decoding, seed) matches.

The summary reports the valid rate, the capped share, micro-F1 against gold,
the single-code baseline (the most frequent dt_train gold code predicted for
every note) and, per note, mention counts that bound the events the instrument
extracts (App. C): first mentions (one P1 decision each), later characters of
first mentions (P2 candidates), and mentions of a code whose category sibling
was named earlier (P2C candidates, capped at two per (code, near-miss) pair).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mistill.models.world_files import FULL, SHORTLIST, load_note_file, load_world
from mistill.shard import Shard


@dataclass(frozen=True)
class TraceSet:
    files: tuple[str, ...]              # note files, in order
    kind: str                           # FULL inventory or SHORTLIST prompt
    narrow_instruction: bool = True     # False: the prompt without the narrow-then-decide sentence (R-C14)
    control_draw: bool = False          # only params instruction_control's seeded draw of the notes (R-C14)


TRACE_SETS: dict[str, TraceSet] = {
    "TR-006": TraceSet(("corpus_char.jsonl",), FULL),
    "TR-007": TraceSet(("corpus_char.jsonl",), SHORTLIST),
    "TR-008": TraceSet(("dt_test.jsonl", "dt_train.jsonl"), SHORTLIST),  # test notes first: the ones scored
    "TR-A": TraceSet(("corpus_char.jsonl",), FULL, narrow_instruction=False, control_draw=True),
    "TR-QWQ": TraceSet(("corpus_char.jsonl",), FULL),   # R-C15: TR-006's notes and prompt, the second teacher
}


def control_draw(note_ids: Sequence[str], params: dict[str, Any]) -> list[str]:
    """R-C14's notes: params instruction_control.notes of `note_ids` drawn with its seed, in their own order."""
    import numpy as np

    from mistill.errors import UserError

    section = params.get("instruction_control") or {}
    try:
        n, seed = int(section["notes"]), int(section["seed"])
    except (KeyError, TypeError, ValueError):
        raise UserError("params.yaml instruction_control: needs `notes` (how many) and `seed`") from None
    if not 2 <= n <= len(note_ids):
        raise UserError(f"params.yaml instruction_control.notes: {n}; between 2 (a knock-in donor) and the "
                        f"{len(note_ids)} characterization notes")
    drawn = set(np.random.default_rng(seed).choice(len(note_ids), size=n, replace=False).tolist())
    return [note_id for i, note_id in enumerate(note_ids) if i in drawn]

# A dotted (or three-character) ICD-10-CM code string standing on its own (METHOD-GUIDE §5:
# dotted inventory code strings at token boundaries, over the whole generated text).
CODE_MENTION = re.compile(r"(?<![A-Za-z0-9.])([A-Z][0-9][0-9A-Z](?:\.[0-9A-Z]{1,4})?)(?![A-Za-z0-9])")


@dataclass(frozen=True)
class MentionCounts:
    mentions: int
    first_mentions: int            # P1: the chapter letter of each first mention
    p2_characters: int             # later characters of first mentions, '.' excluded
    sibling_after: int             # P2C: mentions of a code after a sibling was named (<= 2 per pair)
    first_after_sibling: int       # of those, first mentions (the near-miss decisions proper)

    def as_dict(self) -> dict[str, int]:
        return self.__dict__.copy()


def code_mentions(text: str, codes: Iterable[str]) -> list[tuple[int, str]]:
    """(character offset, code) of every mention of a listed code, in order."""
    listed = set(codes)
    return [(m.start(1), m.group(1)) for m in CODE_MENTION.finditer(text) if m.group(1) in listed]


def mention_counts(text: str, codes: Iterable[str]) -> MentionCounts:
    mentions = code_mentions(text, codes)
    seen: list[str] = []
    pair_uses: Counter = Counter()
    first = p2 = after = first_after = 0
    for _, code in mentions:
        is_first = code not in seen
        if is_first:
            first += 1
            p2 += sum(1 for ch in code[1:] if ch != ".")
        near_misses = {s for s in seen if s != code and s[:3] == code[:3]}
        counted = False
        for near in sorted(near_misses):
            if pair_uses[(code, near)] < 2:  # App. C: first mention and first repeat per pair
                pair_uses[(code, near)] += 1
                counted = True
        if counted:
            after += 1
            first_after += is_first
        if is_first:
            seen.append(code)
    return MentionCounts(len(mentions), first, p2, after, first_after)


def micro_f1(predicted: list[Iterable[str]], gold: list[Iterable[str]]) -> dict[str, float]:
    """Micro-averaged precision, recall and F1 over notes (App. K): counts pooled over notes."""
    tp = fp = fn = 0
    for pred, true in zip(predicted, gold):
        pred, true = set(pred), set(true)
        tp += len(pred & true)
        fp += len(pred - true)
        fn += len(true - pred)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "micro_f1": f1, "tp": tp, "fp": fp, "fn": fn}


def summarize(records: list[dict[str, Any]], gold: dict[str, tuple[str, ...]], splits: dict[str, str],
              candidates: dict[str, list[str]], baseline_code: str | None) -> dict[str, Any]:
    """Valid rate, capped share, micro-F1 (overall and per split), baseline and per-note mention counts."""
    def block(rows: list[dict[str, Any]]) -> dict[str, Any]:
        ids = [r["note_id"] for r in rows]
        result = {
            "notes": len(rows),
            "valid_rate": sum(r["valid"] for r in rows) / len(rows) if rows else 0.0,
            "hit_cap_share": sum(r["hit_cap"] for r in rows) / len(rows) if rows else 0.0,
            "degenerate": sum(r["degenerate"] for r in rows),
            "teacher": micro_f1([r["answer"] for r in rows], [gold[i] for i in ids]),
        }
        if baseline_code is not None:
            result["single_code_baseline"] = {"code": baseline_code,
                                              **micro_f1([[baseline_code]] * len(ids), [gold[i] for i in ids])}
        return result

    per_note = {}
    for r in records:
        counts = mention_counts(r["completion"], candidates[r["note_id"]])
        per_note[r["note_id"]] = {"split": splits[r["note_id"]], "valid": r["valid"],
                                  "n_new_tokens": r["n_new_tokens"], **counts.as_dict()}
    summary: dict[str, Any] = {"overall": block(records)}
    for split in sorted(set(splits.values())):
        rows = [r for r in records if splits[r["note_id"]] == split]
        if rows and len(set(splits.values())) > 1:
            summary[split] = block(rows)
    totals = Counter()
    for counts in per_note.values():
        totals.update({k: v for k, v in counts.items() if isinstance(v, int) and not isinstance(v, bool)})
    summary["mention_totals"] = dict(totals)
    summary["notes_with_sibling_before_chosen"] = sum(1 for c in per_note.values() if c["first_after_sibling"] > 0)
    summary["per_note"] = per_note
    return summary


def most_frequent_code(gold_sets: Iterable[Iterable[str]]) -> str | None:
    """The best single-code baseline's code: the most frequent gold code (ties: smallest code)."""
    counts = Counter(c for codes in gold_sets for c in codes)
    if not counts:
        return None
    top = max(counts.values())
    return min(c for c, n in counts.items() if n == top)


def trace_path(params: dict[str, Any], trace_set: str) -> Path:
    return Path(params["paths"]["artifacts"]) / trace_set / "traces.jsonl"


@dataclass(frozen=True)
class TraceRun:
    path: Path                 # traces.jsonl; summary.json beside it
    summary: dict[str, Any]
    computed: int              # notes generated by this run
    reused: int                # notes whose record was kept (same input key)


def run_trace_set(params: dict[str, Any], trace_set: str, *, spec: str, device: str,
                  limit: int | None = None, batch: int = 16) -> TraceRun:
    """One trace set's records (generated, or kept per note under the same input key) and its summary.

    The transformers backend samples `batch` notes of similar prompt length together (each note
    keeps its own seed's stream, so its trace does not depend on the batch); a batch's records are
    written as it finishes, so a killed run resumes after the last finished batch. Under torchrun
    (vllm data parallel) each process samples its own notes with its own engine, and only rank 0
    returns the summary (the others an empty one)."""
    from tqdm import tqdm

    from mistill.io import provenance, write_json
    from mistill.models.decoding import Decoding
    from mistill.models.fingerprint import model_fingerprint
    from mistill.models.generation import generate
    from mistill.models.loading import ModelSpec, load_model
    from mistill.models.trace_rows import ResumableRows, input_key
    from mistill.models.vllm_backend import EngineSettings
    from mistill.world.answers import parse_answer
    from mistill.world.prompt import template_hash

    section = params["models"]
    trace_spec = TRACE_SETS[trace_set]
    kind = trace_spec.kind
    world = load_world(params, need_shortlists=kind != FULL)
    notes = [n for name in trace_spec.files for n in load_note_file(params, name, world.inventory)]
    if trace_spec.control_draw:
        drawn = set(control_draw([n.note_id for n in notes], params))
        notes = [n for n in notes if n.note_id in drawn]
    notes = notes[:limit or None]
    decoding = Decoding.from_params(params["decoding"])
    base_seed = int(params["seeds"]["decoding"])
    backend = section.get("generation_backend", "transformers")
    # Sampling reads no attention probabilities, so it may use sdpa (the same function as eager, with a
    # fused kernel); the setting is recorded with the decoding settings.
    attn = section.get("generation_attn_implementation") or section.get("attn_implementation", "eager")
    settings = {**decoding.as_dict(), "backend": backend, "attn_implementation": attn}
    model_spec = ModelSpec.from_params(section, spec, base="teacher", attn_implementation=attn)
    model_sha256 = model_fingerprint(model_spec)  # its files, dtype and YaRN: a model retrained in place differs
    prompts = {n.note_id: world.prompt(n, kind, narrow_instruction=trace_spec.narrow_instruction) for n in notes}
    # App. B: one fixed seed for every teacher trace; a record is kept only under the same input key
    rows = ResumableRows(trace_path(params, trace_set),
                         {n.note_id: input_key(model_sha256=model_sha256, prompt=prompts[n.note_id],
                                               decoding=settings, seed=base_seed) for n in notes},
                         shard=Shard.from_env())   # under torchrun: this engine's notes (vllm data parallel)
    todo_ids = set(rows.todo())
    todo = [n for n in notes if n.note_id in todo_ids]
    if todo:
        runner = load_model(model_spec, device=device) if backend == "transformers" else model_spec
        if backend == "vllm":
            pending = [todo]
        else:
            by_length = sorted(todo, key=lambda n: len(prompts[n.note_id]))
            pending = [by_length[i:i + batch] for i in range(0, len(by_length), batch)]
        with rows, tqdm(total=len(todo), desc=trace_set, unit="note", disable=backend == "vllm") as bar:
            for group in pending:
                generations = generate(runner, [prompts[n.note_id] for n in group], seeds=[base_seed] * len(group),
                                       backend=backend, engine=EngineSettings.from_params(section, model_spec.name),
                                       decoding=decoding, batch_size=len(group))
                bar.update(len(group))
                for note, gen in zip(group, generations):
                    parsed = parse_answer(gen.completion, world.inventory, hit_cap=gen.hit_cap)
                    rows.add({
                        "note_id": note.note_id, "prompt": gen.prompt, "completion": gen.completion,
                        "valid": parsed.valid, "hit_cap": parsed.hit_cap, "degenerate": parsed.degenerate,
                        "answer": list(parsed.answer), "n_new_tokens": gen.n_new_tokens, "seed": gen.seed,
                        "decoding": settings, "model": spec, "model_sha256": model_sha256,
                    })
    records = rows.finish()
    if not rows.shard.leader:   # the summary is rank 0's, once every engine's rows are in
        return TraceRun(rows.path, {}, rows.computed, rows.reused)
    gold = {n.note_id: n.gold_codes for n in notes}
    splits = {n.note_id: n.split for n in notes}
    candidates = {n.note_id: [c.code for c in world.candidates(n, kind)] for n in notes}
    train_gold = [n.gold_codes for n in load_note_file(params, "dt_train.jsonl", world.inventory)]
    summary = summarize(records, gold, splits, candidates, most_frequent_code(train_gold))
    # a cached output: what the traces are, never where or how fast they were made
    summary["provenance"] = provenance({"models": section, "decoding": params["decoding"],
                                        "seeds": params["seeds"]}, seed=base_seed, trace_set=trace_set,
                                       prompt_kind=kind, narrow_instruction=trace_spec.narrow_instruction,
                                       model=spec, model_sha256=model_sha256,
                                       prompt_template_sha256=template_hash())
    write_json(rows.path.with_name("summary.json"), summary)
    return TraceRun(rows.path, summary, rows.computed, rows.reused)
