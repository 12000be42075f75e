"""The passes over notes: events, attribution, calibration, knock-in, self-test (App. C "Compute").

Each pass reads the trace file (TR-006 for HD-001) in corpus order and writes
per-note artifacts under `<out_dir>/<note_id>/`, named as the paper names them
(events.jsonl, attr.npz, patch2.jsonl).  A pass is resumable per note: a note
whose artifact exists and validates (its `.meta.json` records the sha256 of the
artifact and its provenance) is skipped; a corrupt or unfinished artifact from a
killed run is reported and recomputed.  A note that cannot be processed (code
mentions outside the inventory, no events) is reported on one line and skipped;
its reason is kept in `<out_dir>/skipped_<pass>.json`.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from mistill.errors import UserError
from mistill.instrument.events import DECISION_KINDS, Event, extract_events
from mistill.io import (
    file_sha256,
    iter_json_lines,
    provenance,
    read_json,
    read_jsonl,
    read_npz,
    remove_stale_temporaries,
    write_json,
    write_jsonl,
    write_npz,
)
from mistill.shard import Shard
from mistill.shard import current as current_shard

NOTE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


# ---- inputs ---------------------------------------------------------------------------------------


@dataclass
class Trace:
    note_id: str
    prompt: str
    completion: str
    patient_id: str | None = None


def load_traces(path: str | Path) -> list[Trace]:
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such trace file (run the traces stage first)")
    traces, seen = [], set()
    for where, row in iter_json_lines(path, "trace"):
        try:
            trace = Trace(str(row["note_id"]), row["prompt"], row["completion"], row.get("patient_id"))
        except (KeyError, TypeError) as err:
            raise UserError(f"{where}: malformed trace record (missing {err})") from None
        if not NOTE_ID.match(trace.note_id):
            raise UserError(f"{where}: note_id {trace.note_id!r} cannot name an artifact directory")
        if trace.note_id in seen:
            raise UserError(f"{where}: duplicate note_id {trace.note_id}")
        seen.add(trace.note_id)
        traces.append(trace)
    if not traces:
        raise UserError(f"{path}: no traces")
    return traces


def model_input(tokenizer, trace: Trace) -> tuple[str, list[int], list[tuple[int, int]], int]:
    """(text, ids, offsets, completion_start): chat_prompt(prompt) + completion, tokenised once."""
    chat = tokenizer.chat_prompt(trace.prompt)
    text = chat + trace.completion
    enc = tokenizer.encode(text)
    return text, list(enc.ids), [tuple(o) for o in enc.offsets], len(chat)


# ---- resumable per-note artifacts -----------------------------------------------------------------


def _meta_path(path: Path) -> Path:
    return path.with_name(path.name + ".meta.json")


def commit_artifact(path: Path, write: Callable[[Path], None], meta: dict) -> None:
    """Write the artifact atomically, then its meta (sha256 + provenance): meta last marks it complete.
    A killed earlier writer's temporary files go first (one process owns a note's directory)."""
    _meta_path(path).unlink(missing_ok=True)
    for written in (path, _meta_path(path)):
        remove_stale_temporaries(written)
    write(path)
    write_json(_meta_path(path), {**meta, "sha256": file_sha256(path)})


def config_sha256(cfg: InstrumentConfig, **settings: Any) -> str:
    """The hash of the instrument parameters an artifact was computed under (a local model by its files);
    `settings` a pass adds beyond the profile's instrument section (the intact re-run's exact kinds)."""
    import hashlib

    from mistill.models.fingerprint import weights_fingerprint

    body = {k: v for k, v in cfg.as_dict().items() if k != "out_dir"}  # where it lies is not what it is
    body.update(settings)
    # a path is not its weights: a teacher retrained in place is another teacher
    if cfg.teacher and Path(cfg.teacher).is_dir():
        body["teacher"] = weights_fingerprint(cfg.teacher)
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def inputs_sha256(*parts: str | Path) -> str:
    """One digest of a note's inputs: strings as given, paths by their content (missing: by name)."""
    import hashlib

    digest = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            digest.update(file_sha256(part).encode() if part.exists() else f"missing:{part.name}".encode())
        else:
            digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def artifact_state(path: Path, loader: Callable[[Path], Any] | None = None, config: str | None = None,
                   inputs: str | None = None) -> str:
    """'missing', 'valid' or a reason it is corrupt (or stale: computed from other parameters or inputs)."""
    meta_path = _meta_path(path)
    if not path.exists() and not meta_path.exists():
        return "missing"
    if not path.exists():
        return "artifact missing beside its meta"
    if not meta_path.exists():
        return "unfinished (no meta; killed run?)"
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError:
        return "unreadable meta"
    if meta.get("sha256") != file_sha256(path):
        return "checksum mismatch"
    if config is not None and meta.get("config_sha256") != config:
        return "stale (computed under other instrument parameters)"
    if inputs is not None and meta.get("inputs_sha256") != inputs:
        return "stale (its inputs changed)"
    if loader is not None:
        try:
            loader(path)
        except Exception as err:  # noqa: BLE001 - any failure to parse means corrupt
            return f"unreadable ({type(err).__name__}: {err})"
    return "valid"


def load_events(path: Path) -> list[Event]:
    return [Event.from_json(row) for row in read_jsonl(path)]


def load_attr(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    for key in ("kinds", "positions", "first_order", "exact", "importance", "margin"):
        if key not in arrays:
            raise ValueError(f"missing array {key}")
    return arrays


def _say(message: str) -> None:
    tqdm.write(message, file=sys.stderr)


class NotePass:
    """Iterate notes with a progress bar, skipping valid artifacts and reporting corrupt ones."""

    def __init__(self, name: str, out_dir: Path, artifact: str, loader=None, force: bool = False,
                 config: str | None = None, shard: Shard | None = None):
        self.name, self.out_dir, self.artifact, self.loader, self.force = name, out_dir, artifact, loader, force
        self.config = config
        self.shard = shard or current_shard()   # under torchrun, this rank's notes (mistill.shard)
        self.skipped: dict[str, str] = {}
        self.done = self.computed = 0

    def path(self, note_id: str) -> Path:
        return self.out_dir / note_id / self.artifact

    def needs(self, note_id: str, inputs: str | None = None, broken: str | None = None) -> bool:
        """Whether the note is to be (re)computed; `broken` names a companion file found unreadable."""
        state = broken or artifact_state(self.path(note_id), self.loader, self.config, inputs)
        if state == "valid" and not self.force:
            self.done += 1
            return False
        if state.startswith("stale"):
            _say(f"mistill instrument {self.name}: {note_id}/{self.artifact} is {state}; recomputing")
        elif state not in ("missing", "valid"):
            _say(f"mistill instrument {self.name}: {note_id}/{self.artifact} is corrupt ({state}); recomputing")
        return True

    def skip(self, note_id: str, reason: str) -> None:
        self.skipped[note_id] = reason
        for stale in (self.path(note_id), _meta_path(self.path(note_id))):  # nothing from an earlier input
            stale.unlink(missing_ok=True)
        _say(f"mistill instrument {self.name}: note {note_id} skipped: {reason}")

    def finish(self, params: dict) -> None:
        """Record the skipped notes. Under torchrun every rank waits here for the others, then knows
        every rank's skips, and rank 0 writes them: each note's file is committed once this returns."""
        ranks = self.shard.gather((self.skipped, self.computed, self.done))
        self.skipped = {note: why for skipped, _, _ in ranks for note, why in sorted(skipped.items())}
        computed, done = sum(r[1] for r in ranks), sum(r[2] for r in ranks)
        if not self.shard.leader:
            return
        write_json(self.out_dir / f"skipped_{self.name}.json",
                   {"skipped": self.skipped, "provenance": provenance(params)})
        on = f" on {self.shard.world} processes" if self.shard.world > 1 else ""
        _say(f"mistill instrument {self.name}: {computed} computed, {done} already done, "
             f"{len(self.skipped)} skipped{on}")


# ---- configuration ----------------------------------------------------------------------------------


@dataclass
class InstrumentConfig:
    traces: str
    inventory: str
    out_dir: str
    teacher: str
    dtype: str | None = None
    device: str = "auto"
    attn_implementation: str = "eager"
    rope_scaling: dict | None = None
    seed: int = 0
    n_null: int = 20
    null_min_distance: int = 8
    p2c_cap: int = 2
    unknown_codes: str = "skip_note"
    hook: str = "detached"
    nominees_topk: int = 40
    nominees_global_topk: int = 16
    null_exact_share: float = 0.5
    max_batch: int = 64
    fdr: float = 0.05
    pool_k: int = 40
    summary_top_k: int = 16
    recurrence_top_k: int = 20
    bins: tuple[int, ...] = (3, 8, 16, 40, 100)
    min_range: float = 1.0
    donor_match: str = "first"
    selftest_events: int = 10
    selftest_top_k: int = 20
    selftest_repeats: int = 6
    noise_floor_sds: float = 3.0

    @classmethod
    def from_params(cls, params: dict) -> InstrumentConfig:
        section = params.get("instrument") or {}
        if not section:
            raise UserError("params.yaml: the active profile has no `instrument` section")
        models = params.get("models") or {}
        flat: dict[str, Any] = {}
        for key, value in section.items():
            if isinstance(value, dict) and key != "rope_scaling":
                flat.update(value)
            else:
                flat[key] = value
        flat.setdefault("teacher", models.get("teacher"))
        flat.setdefault("dtype", models.get("dtype"))
        flat.setdefault("device", models.get("device", "auto"))
        flat.setdefault("attn_implementation", models.get("attn_implementation", "eager"))
        flat.setdefault("rope_scaling", (models.get("rope_scaling") or {}).get("teacher"))
        unknown = set(flat) - set(cls.__dataclass_fields__)
        if unknown:
            raise UserError(f"params.yaml instrument: unknown keys {', '.join(sorted(unknown))}")
        if "bins" in flat:
            flat["bins"] = tuple(int(k) for k in flat["bins"])
        try:
            return cls(**flat)
        except TypeError as err:
            raise UserError(f"params.yaml instrument: {err}") from None

    def with_teacher(self, params: dict, key: str) -> tuple[InstrumentConfig, dict]:
        """The same passes on another teacher of the profile, `models.<key>` with its own YaRN setting
        (R-C15: the second teacher, App. H), and the params its provenance records."""
        models = params.get("models") or {}
        if not models.get(key) or not isinstance(models[key], str):
            raise UserError(f"params.yaml models.{key}: no such model (--teacher takes a params models key)")
        rope_scaling = (models.get("rope_scaling") or {}).get(key)
        params = {**params, "instrument": {**params["instrument"], "teacher": models[key]}}
        return replace(self, teacher=models[key], rope_scaling=rope_scaling), params

    def as_dict(self) -> dict:
        return asdict(self)


def load_teacher(cfg: InstrumentConfig, params: dict | None = None):
    """The teacher as the profile runs it (its revision from params), with the instrument's dtype, YaRN and
    attention implementation."""
    from mistill.models.loading import ModelSpec, load_model

    device = cfg.device
    if device in (None, "auto"):
        device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = ModelSpec.from_params((params or {}).get("models") or {}, cfg.teacher, base="teacher").replace(
        dtype=cfg.dtype, rope_scaling=cfg.rope_scaling, attn_implementation=cfg.attn_implementation)
    model, tokenizer = load_model(spec, device=device)
    model.requires_grad_(False)
    return model, tokenizer


def inventory_codes(path: str | Path) -> list[str]:
    from mistill.world.inventory import load_inventory

    return [c.code for c in load_inventory(path)]


# ---- the passes -------------------------------------------------------------------------------------


def run_events(cfg: InstrumentConfig, params: dict, *, model=None, tokenizer=None, limit: int | None = None,
               force: bool = False) -> dict:
    """Events of every trace (CPU extraction) and their margins (one teacher-forced pass per note)."""
    from mistill.instrument.attribution import margins_at
    from mistill.instrument.patching import _fp32

    traces = load_traces(cfg.traces)[:limit]
    codes = inventory_codes(cfg.inventory)
    if model is None:
        model, tokenizer = load_teacher(cfg, params)
    out = Path(cfg.out_dir)
    note_pass = NotePass("events", out, "events.jsonl", load_events, force, config_sha256(cfg))
    reports: dict[str, dict] = {}
    for trace in tqdm(note_pass.shard.mine(traces), desc="events", unit="note"):
        path = note_pass.path(trace.note_id)
        report_path = out / trace.note_id / "events_report.json"
        trace_digest = inputs_sha256(trace.prompt, trace.completion)
        cached, broken = None, None
        if report_path.exists():
            try:
                cached = read_json(report_path, "events report")
            except UserError:  # the report belongs to the note's artifact: recompute both
                broken = "its events_report.json is unreadable: truncated or corrupt"
        if not note_pass.needs(trace.note_id, trace_digest, broken):
            if cached is not None:
                reports[trace.note_id] = cached
            continue
        text, ids, offsets, start = model_input(tokenizer, trace)
        events, report = extract_events(note_id=trace.note_id, text=text, ids=ids, offsets=offsets,
                                        completion_start=start, codes=codes, tokenizer=tokenizer,
                                        n_null=cfg.n_null, min_null_distance=cfg.null_min_distance,
                                        p2c_cap=cfg.p2c_cap, seed=cfg.seed)
        if report.unknown_mentions and cfg.unknown_codes == "skip_note":
            shown = ", ".join(sorted(set(report.unknown_mentions))[:5])
            note_pass.skip(trace.note_id, f"code mentions outside the inventory: {shown}")
            continue
        if not any(e.kind in DECISION_KINDS for e in events):
            note_pass.skip(trace.note_id, "no decision events (no inventory code mentioned at a token boundary)")
            continue
        with torch.no_grad():
            device = next(model.parameters()).device
            out_logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False,
                               logits_to_keep=torch.tensor([e.pos - 1 for e in events], device=device)).logits
        for e, (m, h) in zip(events, margins_at(_fp32(out_logits[0]), events)):
            e.margin, e.entropy = m, h
        reports[trace.note_id] = asdict(report)
        write_json(report_path, asdict(report))
        commit_artifact(path, lambda p, events=events: write_jsonl(p, [e.to_json() for e in events]),
                        {"n_events": len(events), "n_tokens": len(ids), "config_sha256": config_sha256(cfg),
                         "inputs_sha256": trace_digest,
                         "provenance": provenance(params, cfg.seed)})
        note_pass.computed += 1
    note_pass.finish(params)
    for trace in traces:   # the other ranks' notes (under torchrun): their reports are on disk now
        report_path = out / trace.note_id / "events_report.json"
        if trace.note_id not in reports and trace.note_id not in note_pass.skipped and report_path.exists():
            reports[trace.note_id] = read_json(report_path, "events report")
    summary = _events_summary(out, traces, note_pass, reports)
    if note_pass.shard.leader:
        write_json(out / "events_summary.json", {**summary, "provenance": provenance(params, cfg.seed)})
    return summary


def _events_summary(out: Path, traces: list[Trace], note_pass: NotePass, reports: dict) -> dict:
    counts = {k: 0 for k in ("P1", "P2", "P2C", "NULL")}
    notes_with = {k: 0 for k in counts}
    for trace in traces:
        path = out / trace.note_id / "events.jsonl"
        if trace.note_id in note_pass.skipped or not path.exists():
            continue
        kinds = [e.kind for e in load_events(path)]
        for k in counts:
            counts[k] += kinds.count(k)
            notes_with[k] += k in kinds
    totals: dict[str, int] = {}
    for report in reports.values():
        for key, value in report.items():
            if isinstance(value, int):
                totals[key] = totals.get(key, 0) + value
    return {"notes": len(traces) - len(note_pass.skipped), "skipped": note_pass.skipped,
            "counts": counts, "notes_with": notes_with, "extraction": totals}


def _notes_with_events(cfg: InstrumentConfig, limit: int | None = None) -> list[tuple[Trace, list[Event]]]:
    out = Path(cfg.out_dir)
    notes = []
    for trace in load_traces(cfg.traces)[:limit]:
        path = out / trace.note_id / "events.jsonl"
        state = artifact_state(path, load_events)
        if state == "valid":
            notes.append((trace, load_events(path)))
        elif state != "missing":
            _say(f"mistill instrument: {trace.note_id}/events.jsonl is corrupt ({state}); rerun `events`")
    if not notes:
        raise UserError(f"{out}: no valid events.jsonl; run `mistill instrument events` first")
    return notes


def run_attribution(cfg: InstrumentConfig, params: dict, *, model=None, tokenizer=None,
                    limit: int | None = None, force: bool = False, exact_kinds: Sequence[str] = ("P1",),
                    lanes: int | None = None) -> None:
    """First-order attribution at every event, exact patches of the nominees at `exact_kinds` (the paper's
    pass: P1) and half the NULLs.

    The nominees include the running global top: the heads of largest mean first-order importance over
    the chapter events of the notes already processed. Sharded over `lanes` (the processes of
    torchrun, one lane each; the paper ran seven), each lane keeps its own running top over its own
    notes, note n going to lane n mod lanes, as the paper's lanes did. One lane is the single pass.
    `lanes` in one process computes every lane's notes in turn: the same artifacts as that many
    processes (tested), on one device.
    """
    from mistill.instrument.attribution import RunningGlobalTop, attribute_note
    from mistill.instrument.hook import HeadHook
    from mistill.instrument.patching import prefill

    notes = _notes_with_events(cfg, limit)
    if model is None:
        model, tokenizer = load_teacher(cfg, params)
    hook = HeadHook(model)
    shard = current_shard()
    lanes = shard.world if lanes is None else int(lanes)
    if lanes < 1 or (shard.world > 1 and lanes != shard.world):
        raise UserError(f"attribution lanes {lanes}: under torchrun each of the {shard.world} processes is one lane")
    running = [RunningGlobalTop(hook.n_layers, hook.n_heads) for _ in range(lanes)]
    out = Path(cfg.out_dir)
    # the paper's pass (exact P1) keeps the profile's hash; another choice of exact kinds is another artifact,
    # and so is another number of lanes (each lane's running top sees only its own notes)
    extra = {} if tuple(exact_kinds) == ("P1",) else {"exact_kinds": sorted(exact_kinds)}
    extra.update({"lanes": lanes} if lanes > 1 else {})
    config = config_sha256(cfg, **extra)
    note_pass = NotePass("attribute", out, "attr.npz", load_attr, force, config, shard)
    try:
        # App. C: the running global top-16 depends on note order: the corpus order, logged in the meta.
        for n, (trace, events) in enumerate(tqdm(shard.mine(notes), desc="attribute", unit="note")):
            n = n * shard.world + shard.rank                      # the note's place in the corpus order
            lane = running[n % lanes]
            path = note_pass.path(trace.note_id)
            global_top = lane.top(cfg.nominees_global_topk)
            # the running global top makes a note's nominees depend on the notes before it
            digest = inputs_sha256(trace.prompt, trace.completion, out / trace.note_id / "events.jsonl",
                                   json.dumps(global_top))
            if note_pass.needs(trace.note_id, digest):
                _, ids, _, _ = model_input(tokenizer, trace)
                pre = prefill(model, hook, ids, reserve=cfg.max_batch)
                result = attribute_note(model, hook, pre.cache, pre.mu, ids, events, note_id=trace.note_id,
                                        mode=cfg.hook, nominees_topk=cfg.nominees_topk, global_top=global_top,
                                        exact_kinds=tuple(exact_kinds), null_exact_share=cfg.null_exact_share,
                                        seed=cfg.seed, max_batch=cfg.max_batch)
                del pre
                commit_artifact(path, lambda p, result=result: write_npz(p, **result.arrays()),
                                {"note_index": n, "lane": n % lanes, "hook": cfg.hook, "global_top": global_top, **extra,
                                 "config_sha256": config, "inputs_sha256": digest,
                                 "provenance": provenance(params, cfg.seed)})
                note_pass.computed += 1
            arrays = load_attr(path)
            lane.update(arrays["first_order"][arrays["kinds"] == "P1"])
    finally:
        hook.remove()
    note_pass.finish(params)


def run_calibration(cfg: InstrumentConfig, params: dict, *, limit: int | None = None) -> dict:
    """I_c, tests and global sets from every note's attr.npz -> head_sets_contrast.json.

    It reads every note: under torchrun rank 0 computes it while the others wait, then they read
    its summary."""
    shard = current_shard()
    if shard.world > 1:
        shard.leader_only(lambda: _calibrate(cfg, params, limit))
        return read_json(Path(cfg.out_dir) / "calibration.json", "calibration summary")
    return _calibrate(cfg, params, limit)


def _calibrate(cfg: InstrumentConfig, params: dict, limit: int | None) -> dict:
    from mistill.instrument.calibration import calibrate, note_contrast
    from mistill.instrument.global_sets import head_sets, write_head_sets

    out = Path(cfg.out_dir)
    contrasts, shape = [], None
    for trace, _ in _notes_with_events(cfg, limit):
        path = out / trace.note_id / "attr.npz"
        state = artifact_state(path, load_attr)
        if state != "valid":
            _say(f"mistill instrument calibrate: note {trace.note_id} has no valid attr.npz ({state}); left out")
            continue
        arrays = load_attr(path)
        shape = arrays["importance"].shape[1:]
        contrasts.append(note_contrast(trace.note_id, arrays["kinds"].tolist(), arrays["importance"],
                                       seed=cfg.seed))
    if not contrasts:
        raise UserError(f"{out}: no valid attr.npz; run `mistill instrument attribute` first")
    n_layers, n_heads = shape
    cal = calibrate(contrasts, fdr=cfg.fdr, top_k=min(cfg.summary_top_k, n_layers * n_heads),
                    pool_k=min(cfg.pool_k, n_layers * n_heads), recurrence_top_k=cfg.recurrence_top_k)
    body = head_sets(cal.ic_mean, n_layers, n_heads, pool_k=min(cfg.pool_k, n_layers * n_heads))
    prov = provenance(params, cfg.seed, notes=[c.note_id for c in contrasts])
    write_head_sets(out / "head_sets_contrast.json", body, prov)
    write_json(out / "calibration.json", {**cal.summary, "n_layers": n_layers, "n_heads": n_heads,
                                          "provenance": prov})
    arrays = {}
    for phase, matrix in cal.ic_per_note.items():
        arrays[f"ic_{phase}"] = matrix.astype(np.float32)
        arrays[f"notes_{phase}"] = np.array(cal.ic_notes[phase])
    write_npz(out / "calibration.npz", **arrays)
    return cal.summary


def run_knockin(cfg: InstrumentConfig, params: dict, *, model=None, tokenizer=None, limit: int | None = None,
                force: bool = False) -> dict:
    """Necessity and knock-in per note into the next note's context -> patch2.jsonl, faithfulness2.json."""
    from mistill.instrument.global_sets import load_head_sets, phase_scores
    from mistill.instrument.hook import HeadHook
    from mistill.instrument.knockin import exact_refinement, faithfulness_note, summarize

    out = Path(cfg.out_dir)
    notes = _notes_with_events(cfg, limit)
    sets = load_head_sets(out / "head_sets_contrast.json")
    # the sets by what they rank, not by the provenance beside them (a commit alone must not redo every note)
    sets_digest = json.dumps({k: v for k, v in sets.items() if k != "provenance"}, sort_keys=True)
    global_scores = {p: phase_scores(sets, p) for p in DECISION_KINDS if p in sets["phases"]}
    own: dict[str, dict[str, np.ndarray]] = {}
    cal_path = out / "calibration.npz"
    if cal_path.exists():
        data = read_npz(cal_path, "calibration arrays")
        for phase in DECISION_KINDS:
            if f"ic_{phase}" in data:
                own[phase] = dict(zip(data[f"notes_{phase}"].tolist(), data[f"ic_{phase}"]))
    if model is None:
        model, tokenizer = load_teacher(cfg, params)
    hook = HeadHook(model)
    n_heads_total = hook.n_layers * hook.n_heads
    # App. D: the exact P2C refinement nominates the event's top-k by |A_h| plus the global top
    p2c_global_top = []
    if "P2C" in global_scores:
        order = np.argsort(-global_scores["P2C"], kind="stable")[: cfg.nominees_global_topk]
        p2c_global_top = [(int(i) // hook.n_heads, int(i) % hook.n_heads) for i in order]
    bins = [k for k in cfg.bins if k <= n_heads_total]
    note_pass = NotePass("knockin", out, "patch2.jsonl", read_jsonl, force, config_sha256(cfg))
    try:
        for n, (trace, events) in enumerate(tqdm(notes, desc="knockin", unit="note")):
            if not note_pass.shard.owns(n):
                continue
            path = note_pass.path(trace.note_id)
            donor_trace, donor_events = notes[(n + 1) % len(notes)]  # Sec. 2.3: the next note; wrap
            digest = inputs_sha256(trace.prompt, trace.completion, donor_trace.prompt, donor_trace.completion,
                                   out / trace.note_id / "events.jsonl", out / donor_trace.note_id / "events.jsonl",
                                   out / trace.note_id / "attr.npz", sets_digest, out / "calibration.npz")
            if note_pass.needs(trace.note_id, digest):
                if donor_trace.note_id == trace.note_id:
                    note_pass.skip(trace.note_id, "no other note to serve as the corrupted run")
                    continue
                _, ids, _, _ = model_input(tokenizer, trace)
                _, donor_ids, _, _ = model_input(tokenizer, donor_trace)
                first_p2c = _p2c_first_order(out / trace.note_id / "attr.npz")
                rows = faithfulness_note(
                    model, hook, note_id=trace.note_id, clean_ids=ids, clean_events=events,
                    donor_id=donor_trace.note_id, donor_ids=donor_ids, donor_events=donor_events,
                    global_scores=global_scores,
                    own_scores={p: own.get(p, {}).get(trace.note_id) for p in global_scores},
                    bins=bins, seed=cfg.seed, max_batch=cfg.max_batch, donor_match=cfg.donor_match,
                    p2c_first_order=first_p2c, p2c_nominees_topk=cfg.nominees_topk, p2c_global_top=p2c_global_top)
                commit_artifact(path, lambda p, rows=rows: write_jsonl(p, rows),
                                {"donor": donor_trace.note_id, "bins": bins, "config_sha256": config_sha256(cfg),
                                 "inputs_sha256": digest,
                                 "provenance": provenance(params, cfg.seed)})
                note_pass.computed += 1
    finally:
        hook.remove()
    note_pass.finish(params)
    # every note's rows, the other ranks' too (under torchrun), in the corpus order
    rows_by_note = {t.note_id: read_jsonl(note_pass.path(t.note_id)) for t, _ in notes
                    if t.note_id not in note_pass.skipped}
    summary = summarize(rows_by_note, bins=bins, min_range=cfg.min_range)
    summary.update(bins=bins, n_heads_total=n_heads_total)
    if "P2C" in global_scores:
        firsts = {note: _p2c_first_order(out / note / "attr.npz") for note in rows_by_note}
        summary["p2c_exact_refinement"] = exact_refinement(rows_by_note, firsts, global_scores["P2C"],
                                                           top_k=cfg.pool_k, fdr=cfg.fdr)
    if note_pass.shard.leader:
        write_json(out / "faithfulness2.json", {**summary, "provenance": provenance(params, cfg.seed)})
    return summary


def _p2c_first_order(path: Path) -> dict[int, np.ndarray]:
    """pos -> I^fo [L, H] of each P2C event in a note's attr.npz (empty if it has none)."""
    if artifact_state(path, load_attr) != "valid":
        return {}
    arrays = load_attr(path)
    sel = arrays["kinds"] == "P2C"
    return dict(zip(arrays["positions"][sel].tolist(), arrays["first_order"][sel]))


def run_selftest(cfg: InstrumentConfig, params: dict, *, model=None, tokenizer=None,
                 note_id: str | None = None) -> dict:
    """The fidelity self-test of App. C (Table 8): all heads patched exactly at ten P1 events of one note."""
    from mistill.instrument.attribution import fidelity, self_test_note
    from mistill.instrument.hook import HeadHook
    from mistill.instrument.patching import prefill

    notes = _notes_with_events(cfg)
    if note_id is not None:
        notes = [(t, e) for t, e in notes if t.note_id == note_id]
        if not notes:
            raise UserError(f"note {note_id}: no valid events.jsonl")
    # the first note with the most P1 events up to the requested count
    trace, events = max(notes, key=lambda te: min(sum(e.kind == "P1" for e in te[1]), cfg.selftest_events))
    p1 = [e for e in events if e.kind == "P1"][: cfg.selftest_events]
    if not p1:
        raise UserError("self-test: no note has a P1 event")
    if model is None:
        model, tokenizer = load_teacher(cfg, params)
    hook = HeadHook(model)
    try:
        _, ids, _, _ = model_input(tokenizer, trace)
        pre = prefill(model, hook, ids, reserve=cfg.max_batch)
        bar = tqdm(total=len(p1), desc="selftest", unit="event")
        result = self_test_note(model, hook, pre.cache, pre.mu, ids, p1, repeats=cfg.selftest_repeats,
                                max_batch=cfg.max_batch, progress=bar.update)
        bar.close()
    finally:
        hook.remove()
    sd = float(np.mean(result.repeat_margins.std(axis=1, ddof=1))) if cfg.selftest_repeats > 1 else 0.0
    spread = float(np.max(np.ptp(result.repeat_margins, axis=1)))
    floor = cfg.noise_floor_sds * sd
    n_heads = hook.n_layers * hook.n_heads
    k = min(cfg.selftest_top_k, n_heads)
    summary = {"note_id": trace.note_id, "n_events": len(p1), "n_heads": n_heads, "top_k": k,
               "forward_margin_noise_sd": sd, "forward_noise_range": spread, "single_head_detection_floor": floor,
               "intact": fidelity(result.exact, result.intact, floor=floor, top_k=k),
               "detached": fidelity(result.exact, result.detached, floor=floor, top_k=k),
               "integrated_gradients": fidelity(result.exact, result.integrated, floor=floor, top_k=k)}
    out = Path(cfg.out_dir)
    write_npz(out / "selftest.npz", exact=result.exact, intact=result.intact, detached=result.detached,
              integrated=result.integrated,
              clean_margin=result.clean_margin, repeat_margins=result.repeat_margins, positions=result.positions)
    write_json(out / "selftest.json", {**summary, "provenance": provenance(params, cfg.seed)})
    return summary
