"""Own-heads knock-in on a student's own completed test generations (App. L.4, Table 49; R-D29, R-D30, R-D36).

Every readout of the own-heads chain (`mistill.evaluate.own_heads`) is teacher-forced on the teacher's traces.
Here the student reasons on its own, with its own events and its own near-misses:

(a) the own-trace run: the arm's test-note generations (`DT-eval/<arm>-s<seed>/generations.jsonl`) whose
    reasoning block closes before the token cap (App. K validity) become a trace set,
    `<root>/runs/<arm>-s<seed>/traces.jsonl`, beside `coverage.json` (generated, completed, with events);
(b) the events of App. C extracted from the student's own reasoning with the student's tokenizer, their
    margins from the student itself (`mistill.instrument.passes.run_events`) -> `runs/<arm>-s<seed>/events/`;
(c) the knock-in (App. K, M4) with the arm's own global sets from its teacher-forced chain
    (`HD-S/<arm>-s<seed>`, no attribution pass on the own traces), the donor being the next own trace ->
    `<root>/M6/<arm>-s<seed>/` (`faithfulness2.json`, `<note>/patch2.jsonl`), laid out as the teacher-forced
    cells so that `mistill.evaluate.compare` reads both the same way.

The extracted events are already in the student's tokenization: the knock-in's realisation step (the teacher's
tokenizer to the student's, App. I.1) runs with the student's tokenizer on both sides, where it returns every
decision event at its own position (tested).  A note enters the readout only if its generation completed and
carries events; the coverage is therefore part of the result, and levels across arms on different completion
sets are not a controlled cross-arm effect (App. L.4).
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path

from mistill.errors import UserError
from mistill.io import provenance, read_json, read_jsonl, write_json, write_jsonl


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


def extract_own_events(model, tokenizer, run: OwnTraceRun, params: dict, *, limit: int | None = None,
                       force: bool = False) -> dict:
    """(b): App. C's events of every own trace, in the student's tokenization and with its own margins."""
    from mistill.evaluate.own_heads import weights_fingerprint
    from mistill.instrument.passes import InstrumentConfig, run_events

    cfg = dataclasses.replace(InstrumentConfig.from_params(params), traces=str(run.traces),
                              out_dir=str(run.events_dir), teacher=f"student weights {weights_fingerprint(model)}")
    # provenance records the trace set and output the pass actually read and wrote
    params = {**params, "instrument": {**params["instrument"], "traces": cfg.traces, "out_dir": cfg.out_dir}}
    return run_events(cfg, params, model=model, tokenizer=tokenizer, limit=limit, force=force)


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
                   limit: int | None = None, force: bool = False, model=None, tokenizer=None) -> dict:
    """(a), (b), (c) for one arm and seed; returns the coverage record (also in runs/<arm>-s<seed>/coverage.json).
    `model`, `tokenizer`: the loaded student (default: loaded from `model_spec`)."""
    from mistill.evaluate.own_heads import load_student, run_chain

    heads_from = Path(heads_from)
    if not (heads_from / "head_sets_contrast.json").exists():
        raise UserError(f"{heads_from}: no head_sets_contrast.json (run the arm's own-heads chain first: the "
                        "own-trace knock-in uses the arm's own global sets)")
    run = OwnTraceRun(Path(root), arm, seed)
    coverage = write_own_traces(generations, run)
    if model is None:
        model, tokenizer = load_student(model_spec, params, student_key)
    with_events: list[str] = []
    if coverage["completed"]:
        summary = extract_own_events(model, tokenizer, run, params, limit=limit, force=force)
        skipped = set(summary.get("skipped") or {})
        with_events = [n for n in coverage["completed_notes"][:limit] if n not in skipped]
    coverage.update(with_events=len(with_events), heads_from=str(heads_from), generations=str(generations))
    if len(with_events) < 2:
        run.m6_dir.mkdir(parents=True, exist_ok=True)
        write_empty_readout(run, params, seed, f"{len(with_events)} completed own trace(s) with events")
    else:
        # the student's tokenizer on both sides of the realisation step: the events are its own already
        coverage["seconds"] = run_chain(model_spec, arm, seed, own_trace_params(params, run), stages=["knockin"],
                                        student_key=student_key, limit=limit, force=force, model=model,
                                        tokenizer=tokenizer, teacher_tokenizer=tokenizer, out_root=root,
                                        heads_from=heads_from)
    write_json(run.coverage, {**{k: v for k, v in coverage.items() if k != "seconds"},
                              "provenance": provenance(params, seed)})
    return coverage


def load_coverage(root: str | Path, arm: str, seed: int) -> dict:
    return read_json(OwnTraceRun(Path(root), arm, seed).coverage, "own-trace coverage")
