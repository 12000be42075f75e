"""The own-heads chain for one trained arm and seed (Sec. 4.4, App. K "M4", App. Q R-D6).

Heads are re-ranked in each student after training, on the validation traces, and read on the
test notes (cross-fit, App. K):

(a) attribution: the calibrated attribution pass of App. C on the trained checkpoint, teacher-forced
    on the teacher's validation traces (TR-007), at the teacher's events realised in the student's
    tokenizer (App. I.1 anchor rule; NULL events by the same rule, their letter tokens the
    student's own) -> HD-S/<arm>-s<seed>/head_sets_contrast.json (the student's own ranking I_c);
(b) knock-in (M4): per test note teacher-forced on the teacher's trace (TR-008 test), the own
    top-k per phase knocked into the next test note's context at matched events, beside
    count-matched random sets (redrawn per note and bin) and the bottom-k; recovery

        R = (margin_set - margin_corr) / (margin_all - margin_corr),   gated at 1 nat,

    reported as medians over notes of per-note means -> M6/<arm>-s<seed>/faithfulness2.json and
    <note>/patch2.jsonl; knocking in every head returns the clean margin (the validation check);
(c) read side of the own top-k (16 in the paper) per phase beside as many random heads: M2 region
    lift, M3 loop-back (N vs S), prefix share -> M6/<arm>-s<seed>/readside.json and
    <note>/readside.jsonl;
(d) edits (App. E, R-D28): the teacher's trace edits at the student's realised contrastive events of
    the test notes, teacher-forced: the most recent earlier mention of the near-miss becomes filler,
    an unrelated code or a same-chapter code of another category (`mistill.instrument.edits`, the
    settings of params `read_side.edits`), each re-fed with and without the arm's own top-2 P2C heads
    mean-ablated at the decision -> M6-edits/<arm>-s<seed>/prefix_edit.json and <note>/prefix_edit.jsonl.
    A directory of their own: the edits are the chain's costliest stage and only R-D28 and R-D30 read
    them, so a result that reads the knock-in or the read side (R-D6) never waits for them.

Each stage is a pass over notes, resumable per note (also under `dvc repro`, whose outputs here are
`persist`): a per-note file is reused only when its meta records the same input key, the digest of
the note's trace, its donor's trace (knock-in) and the realised events of both, beside a config key
over the weights, the head sets and the parameters; any other file is recomputed.  Wall time goes
in `<artifacts>/timing/HD-S-....json` / `M6-....json`: timing differs between
machines and runs, so it stays out of the hashed outputs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from mistill.distill.alignment import CompetitorMap, realize_events, realize_null_events
from mistill.distill.targets import competitor_strings
from mistill.errors import UserError
from mistill.instrument.events import DECISION_KINDS, Event, note_rng
from mistill.instrument.passes import (
    InstrumentConfig,
    NotePass,
    Trace,
    commit_artifact,
    inputs_sha256,
    load_events,
    load_traces,
    model_input,
)
from mistill.io import provenance, read_jsonl, write_json, write_jsonl
from mistill.shard import current as current_shard

STAGES = ("attribute", "knockin", "readside", "edits")


@dataclass
class OwnHeadsConfig:
    """params.yaml `evaluate.own_heads` (+ the test set from `evaluate`, instrument settings)."""

    validation_traces: str
    validation_events_dir: str
    test_traces: str
    test_notes: str
    test_events_dir: str
    artifacts: str = "artifacts"
    bins: tuple[int, ...] = (8, 40)
    readside_k: int = 16
    readside_phases: tuple[str, ...] = ("P1", "P2", "P2C")
    seed: int = 0
    min_range: float = 1.0
    donor_match: str = "first"
    max_batch: int = 64

    @classmethod
    def from_params(cls, params: dict) -> OwnHeadsConfig:
        evaluate = params.get("evaluate") or {}
        section = evaluate.get("own_heads")
        if not section:
            raise UserError("params.yaml: the active profile has no `evaluate.own_heads` section")
        knockin = (params.get("instrument") or {}).get("knockin") or {}
        attribution = (params.get("instrument") or {}).get("attribution") or {}
        try:
            return cls(validation_traces=section["validation_traces"],
                       validation_events_dir=section["validation_events_dir"],
                       test_traces=section.get("test_traces", evaluate.get("teacher_traces")),
                       test_notes=evaluate["test_notes"],
                       test_events_dir=section.get("test_events_dir", evaluate.get("events_dir")),
                       artifacts=(params.get("paths") or {}).get("artifacts", "artifacts"),
                       bins=tuple(int(k) for k in section["bins"]), readside_k=int(section["readside_k"]),
                       readside_phases=tuple(section.get("readside_phases", ("P1", "P2", "P2C"))),
                       seed=int(section.get("seed", 0)),
                       min_range=float(knockin.get("min_range", 1.0)),
                       donor_match=str(knockin.get("donor_match", "first")),
                       max_batch=int(attribution.get("max_batch", 64)))
        except KeyError as err:
            raise UserError(f"params.yaml evaluate.own_heads: missing {err}") from None

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def weights_fingerprint(model) -> str:
    """sha256 over the model's parameters: names a checkpoint by its weights."""
    from mistill.distill.targets import teacher_fingerprint

    return teacher_fingerprint(model)


def tokenizer_key(tokenizer) -> str:
    """A tokenizer by its name and, for a compact remap, its table (two remaps may share a name)."""
    table = getattr(tokenizer, "table", None)
    return _digest(str(getattr(tokenizer, "name", type(tokenizer).__name__)), json.dumps(table))


def timing_path(directory: Path) -> Path:
    """Where a stage's wall time goes: `<artifacts>/timing/<HD-S|M6|M6-edits>-<arm>-s<seed>.json`, outside every
    hashed output and every directory a reader depends on (timing differs between runs)."""
    return directory.parent.parent / "timing" / f"{directory.parent.name}-{directory.name}.json"


def arm_dirs(artifacts: str | Path, arm: str, seed: int) -> tuple[Path, Path]:
    """(HD-S/<arm>-s<seed>, M6/<arm>-s<seed>) under the artifacts directory (App. Q names): one parent per
    kind, so a reader depends on every arm and seed the profile runs through one directory."""
    tag = f"{arm}-s{seed}"
    return Path(artifacts) / "HD-S" / tag, Path(artifacts) / "M6" / tag


def edits_dir(artifacts: str | Path, arm: str, seed: int) -> Path:
    """M6-edits/<arm>-s<seed>: the trace edits (stage (d)) and the realised events they were read at."""
    return Path(artifacts) / "M6-edits" / f"{arm}-s{seed}"


# ---- the teacher's events in the student's tokenizer -------------------------------------------------


def realize_note_events(teacher_events: Sequence[dict], teacher_tokenizer, tokenizer, trace: Trace
                        ) -> tuple[list[int], list[Event]]:
    """(student ids, events) of one teacher-forced trace in the student's tokenization.

    P1 / P2 / P2C by the anchor rule of App. I.1 (`mistill.distill.alignment`): the event is kept
    only where the student's next token begins at the anchor, never moved.  NULL events by the same
    rule; their target and competitor letters (" A", " B", ...) become the student's single tokens.
    """
    text, ids, offsets, completion_at = model_input(tokenizer, trace)
    comps = competitor_strings(teacher_tokenizer, list(teacher_events))
    cmap = CompetitorMap(tokenizer)
    realized = realize_events(list(teacher_events), comps, ids=ids, offsets=offsets, text=text,
                              completion_at=completion_at, competitor_map=cmap)
    targets = [teacher_tokenizer.decode([int(ev["target_id"])]) if ev["kind"] == "NULL" else ""
               for ev in teacher_events]
    realized += realize_null_events(list(teacher_events), comps, targets, offsets=offsets, text=text,
                                    completion_at=completion_at, competitor_map=cmap)
    events = []
    for r in realized:
        ev = teacher_events[r.index]
        events.append(Event(r.kind, r.row + 1, int(r.target_id), [int(c) for c in r.competitor_ids],
                            int(ev["anchor"]), code=ev.get("code"), prefix=ev.get("prefix"),
                            near_miss=ev.get("near_miss")))
    events.sort(key=lambda e: (e.pos, ("P1", "P2", "P2C", "NULL").index(e.kind)))
    return ids, events


def write_realized_events(traces: Sequence[Trace], events_dir: Path, out_dir: Path, teacher_tokenizer, tokenizer,
                          params: dict, *, seed: int, force: bool = False) -> dict[str, list[Event]]:
    """<out_dir>/<note>/events.jsonl for every trace with teacher events (resumable per note)."""
    note_pass = NotePass("realize", out_dir, "events.jsonl", load_events, force)
    tokenizers = _digest(tokenizer_key(teacher_tokenizer), tokenizer_key(tokenizer))
    for trace in tqdm(note_pass.shard.mine(traces), desc="realize events", unit="note"):
        path = note_pass.path(trace.note_id)
        source = Path(events_dir) / trace.note_id / "events.jsonl"
        # per note: realised from these teacher events, of this trace, by these tokenizers (else recomputed)
        key = inputs_sha256(source, tokenizers, trace.prompt, trace.completion)
        if note_pass.needs(trace.note_id, key):
            if not source.exists():
                note_pass.skip(trace.note_id, f"no teacher events at {source}")
                continue
            teacher_events = read_jsonl(source)
            _, events = realize_note_events(teacher_events, teacher_tokenizer, tokenizer, trace)
            if not any(e.kind in DECISION_KINDS for e in events):
                note_pass.skip(trace.note_id, "the student realises none of the teacher's decision events")
                continue
            counts = {k: sum(e["kind"] == k for e in teacher_events) for k in ("P1", "P2", "P2C", "NULL")}
            commit_artifact(path, lambda p, events=events: write_jsonl(p, [e.to_json() for e in events]),
                            {"teacher_events": str(source), "inputs_sha256": key, "teacher_counts": counts,
                             "realized_counts": {k: sum(e.kind == k for e in events) for k in counts},
                             "provenance": provenance(params, seed)})
            note_pass.computed += 1
    note_pass.finish(params)
    # every note's events, the other ranks' too (under torchrun): a note's knock-in reads its donor's
    return {t.note_id: load_events(note_pass.path(t.note_id)) for t in traces if t.note_id not in note_pass.skipped}


@dataclass(frozen=True)
class ChainRun:
    """One arm and seed's chain: the student and the tokenizers, its settings, and where it writes (HD-S:
    the own ranking; M6: the readouts on the test notes; M6-edits: the trace edits)."""

    model: object
    tokenizer: object
    teacher_tokenizer: object
    cfg: OwnHeadsConfig
    inst: InstrumentConfig
    hd_dir: Path
    m6_dir: Path
    params: dict
    edits_dir: Path
    limit: int | None = None
    force: bool = False

    def realized_test_events(self, traces: Sequence[Trace], *, force: bool = False,
                             out_dir: Path | None = None) -> dict[str, list[Event]]:
        """The teacher's events of the test notes realised in the student's tokenizer (<out_dir, M6>/<note>/
        events.jsonl): each output directory keeps its own copy, so no stage writes into another's."""
        return write_realized_events(traces, Path(self.cfg.test_events_dir), out_dir or self.m6_dir,
                                     self.teacher_tokenizer, self.tokenizer, self.params, seed=self.cfg.seed,
                                     force=force)


# ---- (a) the student's own ranking ------------------------------------------------------------------


def attribution_stage(run: ChainRun) -> dict:
    """App. C's calibrated attribution pass on the student over the validation traces -> head sets."""
    from mistill.instrument.passes import run_attribution, run_calibration

    traces = load_traces(run.cfg.validation_traces)[:run.limit]
    write_realized_events(traces, Path(run.cfg.validation_events_dir), run.hd_dir, run.teacher_tokenizer,
                          run.tokenizer, run.params, seed=run.cfg.seed, force=run.force)
    # the pass's config hash names the checkpoint by its weights, so a retrained arm is recomputed
    student_cfg = dataclasses.replace(run.inst, traces=run.cfg.validation_traces, out_dir=str(run.hd_dir),
                                      teacher=f"student weights {weights_fingerprint(run.model)}")
    run_attribution(student_cfg, run.params, model=run.model, tokenizer=run.tokenizer, limit=run.limit,
                    force=run.force)
    return run_calibration(student_cfg, run.params, limit=run.limit)


# ---- (b) knock-in of the own heads on the test notes --------------------------------------------------


def test_traces(cfg: OwnHeadsConfig, limit: int | None = None) -> list[Trace]:
    """The teacher's traces of the test notes, in the test notes' order (TR-008 test)."""
    from mistill.world.notes import load_notes

    by_id = {t.note_id: t for t in load_traces(cfg.test_traces)}
    test_ids = [n.note_id for n in load_notes(cfg.test_notes)]
    missing = [n for n in test_ids if n not in by_id]
    if len(missing) == len(test_ids):
        raise UserError(f"{cfg.test_traces}: no trace of any test note of {cfg.test_notes}")
    return [by_id[n] for n in test_ids if n in by_id][:limit]


def own_scores(head_sets: dict) -> dict[str, np.ndarray]:
    from mistill.instrument.global_sets import phase_scores

    return {p: phase_scores(head_sets, p) for p in DECISION_KINDS if p in head_sets["phases"]}


def knockin_stage(run: ChainRun) -> dict:
    """Own top-k, random-k and bottom-k knocked into the next test note's context (App. K, M4)."""
    from mistill.instrument.global_sets import load_head_sets
    from mistill.instrument.hook import HeadHook
    from mistill.instrument.knockin import faithfulness_note, summarize

    head_sets_path = run.hd_dir / "head_sets_contrast.json"
    scores = own_scores(load_head_sets(head_sets_path))
    traces = test_traces(run.cfg, run.limit)
    events = run.realized_test_events(traces, force=run.force)
    notes = [t for t in traces if t.note_id in events]
    hook = HeadHook(run.model)
    n_total = hook.n_layers * hook.n_heads
    bins = [k for k in run.cfg.bins if k <= n_total]
    if not bins:
        raise UserError(f"evaluate.own_heads.bins {list(run.cfg.bins)}: none fits the model's {n_total} heads")
    # the ranking itself, not the head-sets file's bytes (its provenance names the code version)
    ranking = json.dumps({p: v.tolist() for p, v in sorted(scores.items())})
    digest = _digest(run.cfg.digest(), ranking, weights_fingerprint(run.model))
    note_pass = NotePass("own-knockin", run.m6_dir, "patch2.jsonl", read_jsonl, run.force, digest)
    try:
        for n, trace in enumerate(tqdm(notes, desc="own-heads knock-in", unit="note")):
            if not note_pass.shard.owns(n):
                continue
            path = note_pass.path(trace.note_id)
            donor = notes[(n + 1) % len(notes)]  # App. K: the donor is the next test note; wrap
            # the note's patches read its trace, its donor's trace and the realised events of both
            key = inputs_sha256(trace.prompt, trace.completion, donor.note_id, donor.prompt, donor.completion,
                                run.m6_dir / trace.note_id / "events.jsonl",
                                run.m6_dir / donor.note_id / "events.jsonl")
            if note_pass.needs(trace.note_id, key):
                if donor.note_id == trace.note_id:
                    note_pass.skip(trace.note_id, "no other test note to serve as the corrupted run")
                    continue
                _, ids, _, _ = model_input(run.tokenizer, trace)
                _, donor_ids, _, _ = model_input(run.tokenizer, donor)
                rows = faithfulness_note(
                    run.model, hook, note_id=trace.note_id, clean_ids=ids, clean_events=events[trace.note_id],
                    donor_id=donor.note_id, donor_ids=donor_ids, donor_events=events[donor.note_id],
                    global_scores=scores, own_scores={p: None for p in scores}, bins=bins, seed=run.cfg.seed,
                    max_batch=run.cfg.max_batch, donor_match=run.cfg.donor_match)
                commit_artifact(path, lambda p, rows=rows: write_jsonl(p, rows),
                                {"donor": donor.note_id, "bins": bins, "heads_from": str(head_sets_path),
                                 "config_sha256": digest, "inputs_sha256": key,
                                 "provenance": provenance(run.params, run.cfg.seed)})
                note_pass.computed += 1
    finally:
        hook.remove()
    note_pass.finish(run.params)
    rows_by_note = {t.note_id: read_jsonl(note_pass.path(t.note_id)) for t in notes
                    if t.note_id not in note_pass.skipped}
    summary = summarize(rows_by_note, bins=bins, min_range=run.cfg.min_range)
    summary.update(bins=bins, n_heads_total=n_total, heads_from=str(head_sets_path),
                   notes=list(rows_by_note), set_kinds={"top": "own top-k by I_c (validation traces)",
                                                        "random": "count-matched random, per note and bin",
                                                        "bottom": "own bottom-k by I_c"})
    if note_pass.shard.leader:
        write_json(run.m6_dir / "faithfulness2.json",
                   {**summary, "provenance": provenance(run.params, run.cfg.seed)})
    return summary


# ---- (c) the read side of the own top-k --------------------------------------------------------------


def readside_panels(scores: dict[str, np.ndarray], k: int, n_layers: int, n_heads: int, seed: int,
                    phases: Sequence[str]) -> dict[str, dict[str, list[int]]]:
    """Per phase: the own top-k by I_c and k random heads (one seeded draw per phase, App. E panel)."""
    n = n_layers * n_heads
    k = min(k, n)
    panels = {}
    for phase in phases:
        if phase not in scores:
            continue
        top = np.argsort(-scores[phase], kind="stable")[:k]
        random = note_rng(seed, f"readside:{phase}:random").choice(n, size=k, replace=False)
        panels[phase] = {"top": [int(h) for h in top], "random": [int(h) for h in random]}
    return panels


def readside_stage(run: ChainRun) -> dict:
    """M2, M3 and prefix share of the own top-k per phase on the test notes -> readside.json."""
    from mistill.instrument.global_sets import load_head_sets
    from mistill.instrument.readside import ReadEvent, note_layout, read_note, summarize_panels

    sets = load_head_sets(run.hd_dir / "head_sets_contrast.json")
    L, H = sets["n_layers"], sets["n_heads"]
    panels = readside_panels(own_scores(sets), run.cfg.readside_k, L, H, run.cfg.seed, run.cfg.readside_phases)
    heads = sorted({h for by in panels.values() for hs in by.values() for h in hs})
    pairs = [(h // H, h % H) for h in heads]
    digest = _digest(run.cfg.digest(), json.dumps(panels, sort_keys=True), weights_fingerprint(run.model))
    note_pass = NotePass("readside", run.m6_dir, "readside.jsonl", read_jsonl, run.force, digest)
    traces = test_traces(run.cfg, run.limit)
    realized = run.realized_test_events(traces)
    read = [t for t in traces if t.note_id in realized]
    for trace in tqdm(note_pass.shard.mine(read), desc="read side", unit="note"):
        path = note_pass.path(trace.note_id)
        key = inputs_sha256(trace.prompt, trace.completion, run.m6_dir / trace.note_id / "events.jsonl")
        if note_pass.needs(trace.note_id, key):
            text, ids, offsets, completion_at = model_input(run.tokenizer, trace)
            layout = note_layout(text, offsets, trace.prompt, completion_at)
            events = [ReadEvent(e.kind, e.pos, e.anchor, e.code, e.prefix or "", e.near_miss)
                      for e in realized[trace.note_id] if e.kind in panels]
            rows = read_note(run.model, ids, layout, events, pairs)
            commit_artifact(path, lambda p, rows=rows: write_jsonl(p, rows),
                            {"panels": panels, "config_sha256": digest, "inputs_sha256": key,
                             "provenance": provenance(run.params, run.cfg.seed)})
            note_pass.computed += 1
    note_pass.finish(run.params)
    rows_by_note = {t.note_id: read_jsonl(note_pass.path(t.note_id)) for t in read}
    summary = summarize_panels(rows_by_note, panels)
    body = {"k": min(run.cfg.readside_k, L * H), "panels": panels, "phases": summary,
            "heads_from": str(run.hd_dir / "head_sets_contrast.json"),
            "provenance": provenance(run.params, run.cfg.seed)}
    if note_pass.shard.leader:
        write_json(run.m6_dir / "readside.json", body)
    return body


# ---- (d) the trace edits on the student ---------------------------------------------------------------


def edits_stage(run: ChainRun) -> dict:
    """App. E's prefix edits at the student's realised P2C events of the test notes, mediated by the arm's
    own top-2 P2C heads -> M6-edits/<arm>-s<seed>/<note>/prefix_edit.jsonl, prefix_edit.json."""
    from mistill.instrument.edits import (
        EditSettings,
        NoteInput,
        filler_token_id,
        prefix_edit_note,
        with_near_miss_spans,
    )
    from mistill.instrument.global_sets import load_head_sets
    from mistill.instrument.hook import HeadHook
    from mistill.instrument.patching import prefill
    from mistill.instrument.read_passes import ReadSide
    from mistill.world.inventory import load_inventory

    edits = ReadSide.from_params(run.params).edits
    sets = load_head_sets(run.hd_dir / "head_sets_contrast.json")
    H = sets["n_heads"]
    top = np.argsort(-own_scores(sets)["P2C"], kind="stable")[:2]
    mediation = tuple((int(h) // H, int(h) % H) for h in top)
    settings = EditSettings(filler_id=filler_token_id(run.tokenizer, edits.filler), mediation_heads=mediation,
                            seed=run.cfg.seed, max_events=edits.max_events_per_note)
    codes = [c.code for c in load_inventory((run.params.get("instrument") or {})["inventory"])]
    digest = _digest(run.cfg.digest(), json.dumps(dataclasses.asdict(settings)), weights_fingerprint(run.model))
    note_pass = NotePass("edits", run.edits_dir, "prefix_edit.jsonl", read_jsonl, run.force, digest)
    traces = test_traces(run.cfg, run.limit)
    realized = run.realized_test_events(traces, force=run.force, out_dir=run.edits_dir)
    edited = [t for t in traces if t.note_id in realized]
    hook = HeadHook(run.model)
    try:
        for trace in tqdm(note_pass.shard.mine(edited), desc="edits", unit="note"):
            key = inputs_sha256(trace.prompt, trace.completion, run.edits_dir / trace.note_id / "events.jsonl")
            if not note_pass.needs(trace.note_id, key):
                continue
            note = NoteInput.from_trace(run.tokenizer, trace)
            events = with_near_miss_spans(note, realized[trace.note_id])
            pre = prefill(run.model, hook, note.ids, reserve=edits.pack_tokens)
            rows = prefix_edit_note(run.model, hook, pre, note, events, codes=codes, tokenizer=run.tokenizer,
                                    settings=settings, pack_tokens=edits.pack_tokens)
            del pre
            commit_artifact(note_pass.path(trace.note_id), lambda p, rows=rows: write_jsonl(p, rows),
                            {"mediation_heads": [list(h) for h in mediation], "config_sha256": digest,
                             "inputs_sha256": key, "provenance": provenance(run.params, run.cfg.seed)})
            note_pass.computed += 1
    finally:
        hook.remove()
    note_pass.finish(run.params)
    body = {"mediation_heads": [f"l{layer}h{head}" for layer, head in mediation], "filler": edits.filler,
            "notes": [t.note_id for t in edited if t.note_id not in note_pass.skipped],
            "heads_from": str(run.hd_dir / "head_sets_contrast.json"), "provenance": provenance(run.params, run.cfg.seed)}
    if note_pass.shard.leader:
        write_json(run.edits_dir / "prefix_edit.json", body)
    return body


# ---- the chain ----------------------------------------------------------------------------------------


def load_student(spec: str, params: dict, student_key: str | None = None):
    from mistill.models.loading import ModelSpec, load_model

    models = params.get("models") or {}
    device = models.get("device", "auto")
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    attn = ((params.get("instrument") or {}).get("attribution") or {}).get("attn_implementation", "sdpa")
    model, tokenizer = load_model(ModelSpec.from_params(models, spec, base=student_key, attn_implementation=attn),
                                  device=device)
    model.requires_grad_(False)
    return model, tokenizer


def run_chain(model_spec: str, arm: str, seed: int, params: dict, *, stages: Sequence[str] = STAGES,
              student_key: str | None = None, limit: int | None = None, force: bool = False,
              model=None, tokenizer=None, teacher_tokenizer=None, out_root: str | Path | None = None,
              heads_from: str | Path | None = None) -> dict:
    """Stages (a) to (d) for one arm and seed; returns {stage: wall seconds} (also in `<dir>.timing.json`).

    `out_root` puts HD-S/ and M6/ under another directory than params `paths.artifacts` (a second read
    of one checkpoint, App. L.6); `heads_from` names an HD-S directory whose ranking the knock-in and
    read side use instead of the run's own (the knock-in without the attribution pre-pass, App. L.6).
    """
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise UserError(f"unknown own-heads stage(s) {', '.join(unknown)}; known: {', '.join(STAGES)}")
    if heads_from is not None and "attribute" in stages:
        raise UserError("--heads-from reads another run's head sets: run the knockin or readside stages with it, "
                        "not attribute")
    cfg = OwnHeadsConfig.from_params(params)
    if out_root is not None:
        cfg = dataclasses.replace(cfg, artifacts=str(out_root))
    hd_dir, m6_dir = arm_dirs(cfg.artifacts, arm, seed)
    if heads_from is not None:
        hd_dir = Path(heads_from)
        if not (hd_dir / "head_sets_contrast.json").exists():
            raise UserError(f"--heads-from {hd_dir}: no head_sets_contrast.json (run the arm's own-heads "
                            "attribution first)")
    inst = InstrumentConfig.from_params(params)
    if model is None:
        model, tokenizer = load_student(model_spec, params, student_key)
    if teacher_tokenizer is None:
        from mistill.models.loading import ModelSpec, load_tokenizer

        teacher_tokenizer = load_tokenizer(ModelSpec.from_params(params.get("models") or {}, "teacher"))
    run = ChainRun(model, tokenizer, teacher_tokenizer, cfg, inst, hd_dir, m6_dir, params,
                   edits_dir(cfg.artifacts, arm, seed), limit, force)
    passes = {"attribute": attribution_stage, "knockin": knockin_stage, "readside": readside_stage,
              "edits": edits_stage}
    timing: dict[str, float] = {}
    for stage in STAGES:
        if stage not in stages:
            continue
        start = time.perf_counter()
        passes[stage](run)
        timing[stage] = time.perf_counter() - start
    # each directory records the stages that write it, so the attribution (HD-S) and the readouts (M6)
    # can be separate pipeline stages with disjoint outputs
    for directory, owned in ((hd_dir, ("attribute",)), (m6_dir, ("knockin", "readside")),
                             (run.edits_dir, ("edits",))):
        part = {k: v for k, v in timing.items() if k in owned}
        if not part or not current_shard().leader:
            continue
        path = timing_path(directory)
        previous = json.loads(path.read_text()).get("seconds", {}) if path.exists() else {}
        write_json(path, {"seconds": {**previous, **part}, "model": str(model_spec), "arm": arm, "seed": seed,
                          "threads": torch.get_num_threads(), "provenance": provenance(params, seed)})
        (directory / "timing.json").unlink(missing_ok=True)  # where earlier runs wrote it, inside the output
    return timing
