"""Own-heads knock-in on a student's own completed test generations (App. L.4, Table 49; R-D29, R-D30, R-D36).

Every readout of the own-heads chain (`mistill.evaluate.own_heads`) is teacher-forced on the teacher's traces.
Here the student reasons on its own, with its own events and its own near-misses:

(a) the own-trace run: the arm's test-note generations (`DT-eval/<arm>-s<seed>/generations.jsonl`) whose
    reasoning block closes before the token cap (App. K validity) become a trace set,
    `<root>/runs/<arm>-s<seed>/traces.jsonl`, beside `coverage.json` (generated, completed, with events);
(b) the events of App. C in the student's own reasoning -> `runs/<arm>-s<seed>/events/`;
(c) the knock-in (App. K, M4) with the arm's own global sets from its teacher-forced chain
    (`HD-S/<arm>-s<seed>`, no attribution pass on the own traces), the donor being the next own trace ->
    `<root>/M6/<arm>-s<seed>/` (`faithfulness2.json`, `<note>/patch2.jsonl`), laid out as the teacher-forced
    cells so that `mistill.evaluate.compare` reads both the same way.

Which events, in which tokenization (reconstruction; the paper says the events were "extracted with the
student's tokenizer"): App. C's rules are character rules over a tokenization in which a code's characters are
one token each (P2, P2C: the first character that separates a code from its alternatives or its near-miss).
Qwen3's tokenizer is such a tokenization; SmolLM3's merges digit runs ("18"), where the rules would find no P2 or
P2C decision at all.  So (b) applies App. C's rules to the student's text in the teacher's tokenization, and the
knock-in realises those events in the student's tokenizer by App. I.1's anchor rule (an event is kept only where
the student's next token begins at the decided character, never moved), exactly as it realises the teacher's
events on the teacher's traces: the own-trace and teacher-forced cells read one event definition.  For a student
that shares the teacher's tokenizer the realisation is the identity (tested).  The events' margins are the
knock-in's own (its clean run), so (b) needs no model.

A note enters the readout only if its generation completed and carries realised events; the coverage is
therefore part of the result, and levels across arms on different completion sets are not a controlled
cross-arm effect (App. L.4).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from mistill.errors import UserError
from mistill.io import provenance, read_json, read_jsonl, write_json, write_jsonl


def own_trace_root(artifacts: str | Path) -> Path:
    """Where the own-trace chain writes by default: <artifacts>/own-trace (runs/ and M6/ under it)."""
    return Path(artifacts) / "own-trace"


@dataclass(frozen=True)
class OwnTraceRun:
    """Where one arm-seed's own-trace run and its knock-in live under `root` (params paths.artifacts/own-trace)."""

    root: Path
    arm: str
    seed: int

    @property
    def tag(self) -> str:
        return f"{self.arm}-s{self.seed}"

    @property
    def run_dir(self) -> Path:
        return self.root / "runs" / self.tag

    @property
    def traces(self) -> Path:
        return self.run_dir / "traces.jsonl"

    @property
    def events_dir(self) -> Path:
        return self.run_dir / "events"

    @property
    def coverage(self) -> Path:
        return self.run_dir / "coverage.json"

    @property
    def m6_dir(self) -> Path:
        return self.root / "M6" / self.tag


def completed_generations(generations: str | Path) -> tuple[list[dict], int]:
    """(the rows whose reasoning block closed before the cap, in file order; the number of rows)."""
    rows = read_jsonl(generations, "test-note generations")
    bad = [r.get("note_id", "?") for r in rows if "valid" not in r or "completion" not in r or "prompt" not in r]
    if bad:
        raise UserError(f"{generations}: rows without prompt, completion or validity (e.g. note {bad[0]}): "
                        "not the output of `mistill evaluate arm`")
    return [r for r in rows if r["valid"] and not r.get("hit_cap")], len(rows)


def prune(directory: Path, keep: set[str]) -> None:
    """Remove per-note directories of notes no longer in the run (an earlier run's generations), so a
    re-run's outputs equal a fresh run's."""
    if directory.is_dir():
        for child in directory.iterdir():
            if child.is_dir() and child.name not in keep:
                shutil.rmtree(child)


def write_own_traces(generations: str | Path, run: OwnTraceRun) -> dict:
    """(a): the completed generations as a trace set; returns the counts written to coverage.json."""
    kept, n_rows = completed_generations(generations)
    notes = {r["note_id"] for r in kept}
    prune(run.events_dir, notes)
    prune(run.m6_dir, notes)
    traces = [{"note_id": r["note_id"], "prompt": r["prompt"], "completion": r["completion"],
               **({"patient_id": r["patient_id"]} if r.get("patient_id") is not None else {})} for r in kept]
    run.run_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(run.traces, traces)
    return {"generated": n_rows, "completed": len(traces), "completed_notes": [t["note_id"] for t in traces]}


def extract_own_events(teacher_tokenizer, run: OwnTraceRun, params: dict, *, limit: int | None = None) -> dict:
    """(b): App. C's events of every own trace in the teacher's tokenization (the module's docstring says why);
    returns {note: why} for the notes left without events (a code outside the inventory, no decision)."""
    from mistill.instrument.events import DECISION_KINDS, extract_events
    from mistill.instrument.passes import InstrumentConfig, inventory_codes, load_traces, model_input

    cfg = InstrumentConfig.from_params(params)
    codes = inventory_codes(cfg.inventory)
    skipped: dict[str, str] = {}
    for trace in tqdm(load_traces(run.traces)[:limit], desc="own-trace events", unit="note"):
        text, ids, offsets, start = model_input(teacher_tokenizer, trace)
        events, report = extract_events(note_id=trace.note_id, text=text, ids=ids, offsets=offsets,
                                        completion_start=start, codes=codes, tokenizer=teacher_tokenizer,
                                        n_null=cfg.n_null, min_null_distance=cfg.null_min_distance,
                                        p2c_cap=cfg.p2c_cap, seed=cfg.seed)
        path = run.events_dir / trace.note_id / "events.jsonl"
        if report.unknown_mentions and cfg.unknown_codes == "skip_note":
            skipped[trace.note_id] = "a code mention outside the inventory"
        elif not any(e.kind in DECISION_KINDS for e in events):
            skipped[trace.note_id] = "no decision event"
        else:
            write_jsonl(path, [e.to_json() for e in events])
            continue
        path.unlink(missing_ok=True)   # nothing from an earlier run's generation of this note
    return skipped


def own_trace_params(params: dict, run: OwnTraceRun) -> dict:
    """params with the own-heads chain's test set pointed at the own-trace run (its traces and events)."""
    evaluate = params.get("evaluate") or {}
    section = {**(evaluate.get("own_heads") or {}), "test_traces": str(run.traces),
               "test_events_dir": str(run.events_dir)}
    return {**params, "evaluate": {**evaluate, "own_heads": section}}


def write_empty_readout(run: OwnTraceRun, params: dict, seed: int, why: str) -> None:
    """A knock-in summary with no notes, for an arm whose own traces leave fewer than two notes with
    events (a knock-in needs another note as the corrupted run): the readout is then empty, not missing."""
    write_json(run.m6_dir / "faithfulness2.json", {"notes": [], "phases": {}, "empty_because": why,
                                                   "provenance": provenance(params, seed)})


def run_own_traces(model_spec: str, arm: str, seed: int, params: dict, *, generations: str | Path,
                   heads_from: str | Path, root: str | Path, student_key: str | None = None,
                   limit: int | None = None, force: bool = False, model=None, tokenizer=None,
                   teacher_tokenizer=None) -> dict:
    """(a), (b), (c) for one arm and seed; returns the coverage record (also in runs/<arm>-s<seed>/coverage.json).
    `model`, `tokenizer`: the loaded student (default: loaded from `model_spec`); `teacher_tokenizer`: the
    teacher's (default: params models.teacher's)."""
    from mistill.evaluate.own_heads import load_student, run_chain

    heads_from = Path(heads_from)
    if not (heads_from / "head_sets_contrast.json").exists():
        raise UserError(f"{heads_from}: no head_sets_contrast.json (run the arm's own-heads chain first: the "
                        "own-trace knock-in uses the arm's own global sets)")
    run = OwnTraceRun(Path(root), arm, seed)
    coverage = write_own_traces(generations, run)
    if teacher_tokenizer is None:
        from mistill.models.loading import ModelSpec, load_tokenizer

        teacher_tokenizer = load_tokenizer(ModelSpec.from_params(params.get("models") or {}, "teacher"))
    with_events: list[str] = []
    if coverage["completed"]:
        skipped = extract_own_events(teacher_tokenizer, run, params, limit=limit)
        with_events = [n for n in coverage["completed_notes"][:limit] if n not in skipped]
        coverage["without_events"] = skipped
    coverage.update(with_events=len(with_events), heads_from=str(heads_from), generations=str(generations))
    if len(with_events) < 2:
        run.m6_dir.mkdir(parents=True, exist_ok=True)
        write_empty_readout(run, params, seed, f"{len(with_events)} completed own trace(s) with events")
    else:
        if model is None:
            model, tokenizer = load_student(model_spec, params, student_key)
        coverage["seconds"] = run_chain(model_spec, arm, seed, own_trace_params(params, run), stages=["knockin"],
                                        student_key=student_key, limit=limit, force=force, model=model,
                                        tokenizer=tokenizer, teacher_tokenizer=teacher_tokenizer, out_root=root,
                                        heads_from=heads_from)
    write_json(run.coverage, {**{k: v for k, v in coverage.items() if k != "seconds"},
                              "provenance": provenance(params, seed)})
    return coverage


def load_coverage(root: str | Path, arm: str, seed: int) -> dict:
    return read_json(OwnTraceRun(Path(root), arm, seed).coverage, "own-trace coverage")
