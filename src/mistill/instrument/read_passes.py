"""What the teacher's heads read, over HD-001's notes (Sec. 3.3, App. E): three passes.

    readside  one prefill per note with query/key capture; every panel head's attention at every
              decision event split over the 15 key categories, its region lift and n_eff, beside
              its importance at that event (attr.npz)      -> <out>/readside/<note>/read.jsonl (R-C5)
    keys      the key-side intervention: each named head loses its named keys at the decision
              token, against an empty-key reference and matched control keys, beside its
              mean-ablation effect                            -> <out>/keys/<note>/key_intervene.jsonl (R-C10)
    edits     the earlier sibling mention replaced in the trace, and the note's distinguishing
              words replaced, re-fed to the decision         -> <out>/edits/<note>/prefix_edit.jsonl,
                                                                evidence_edit.jsonl (R-C11)

The panel (App. E): the union of each phase's global top-k, the global bottom-k of the chapter (P1)
and contrastive (P2C) rankings, and k random heads drawn once with a fixed seed (the paper's k = 16
gives 68 distinct heads of 1,600).  The named heads (params `readers.named_heads`: region readers,
prose readers, contrastive readers) are read whether or not the panel holds them.

Every pass is resumable per note as HD-001's are (`passes.NotePass`): a note's artifact records
the digest of its inputs (trace, events, attributions, head sets) and of the pass's settings.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from mistill.errors import UserError
from mistill.instrument.events import DECISION_KINDS, note_rng
from mistill.instrument.global_sets import load_head_sets, phase_scores
from mistill.instrument.passes import (
    InstrumentConfig,
    NotePass,
    _notes_with_events,
    commit_artifact,
    inputs_sha256,
    load_attr,
    load_teacher,
    model_input,
)
from mistill.io import file_sha256, provenance, read_jsonl, write_json, write_jsonl
from mistill.params import profile_section

# ---- settings -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EditsSection:
    """The profile's `read_side.edits`: the trace and note edits (App. E, R-C11)."""

    max_events_per_note: int = 20       # contrastive events edited per note, a seeded subset
    filler: str = " ."                  # the non-code filler: one token, repeated to the span's length
    mediation_min_effect: float = 0.5   # nats: the mediated share is read over events above it
    pack_tokens: int = 512              # tokens of one packed re-feed forward (its attention mask is
                                        # pack_tokens x (note + pack_tokens)); results do not depend on it


@dataclass(frozen=True)
class ReadSide:
    """The profile's `read_side` section: where the passes write and the panel's size."""

    out_dir: str
    panel_k: int                        # top-k per phase, bottom-k of P1 and P2C, k random (paper 16)
    shortlist_out_dir: str = "artifacts/HD-002-read"   # the read side on the shortlist run (HD-002, R-C7)
    seed: int = 0
    key_block_min_effect: float = 0.1   # nats: D/E is read over events where the head's E exceeds it
    edits: EditsSection = field(default_factory=EditsSection)

    @classmethod
    def from_params(cls, params: dict) -> ReadSide:
        where, section = profile_section(params, "read_side",
                                         "it names the read-side passes' directory and panel size")
        try:
            edits = EditsSection(**(section.get("edits") or {}))
            out = cls(**{**section, "edits": edits})
        except TypeError as err:
            raise UserError(f"{where}: {err}") from None
        if not isinstance(out.panel_k, int) or out.panel_k < 1:
            raise UserError(f"{where}.panel_k: a positive set size, got {out.panel_k!r}")
        if not isinstance(edits.max_events_per_note, int) or edits.max_events_per_note < 1:
            raise UserError(f"{where}.edits.max_events_per_note: a positive count, got {edits.max_events_per_note!r}")
        if not isinstance(edits.pack_tokens, int) or edits.pack_tokens < 1:
            raise UserError(f"{where}.edits.pack_tokens: a positive token count, got {edits.pack_tokens!r}")
        return out

    def pass_dir(self, name: str) -> Path:
        """Each pass's own directory (`readside`, `keys`, `edits`): one DVC output per stage."""
        return Path(self.out_dir) / name

    def digest(self, *parts: str) -> str:
        """The passes' config key: every setting that can change a result (the pack size cannot)."""
        settings = asdict(self)
        del settings["edits"]["pack_tokens"]
        body = json.dumps([settings, *parts], sort_keys=True, default=str)
        return hashlib.sha256(body.encode()).hexdigest()


# ---- the panel --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Panel:
    """Flat head ids (layer * n_heads + head) of each group the read side reports."""

    top: dict[str, list[int]]       # phase -> global top-k
    bottom: dict[str, list[int]]    # P1, P2C -> global bottom-k
    random: list[int]
    named: list[int]                # the heads params name by role

    def heads(self) -> list[int]:
        every = [*self.random, *self.named]
        for group in (self.top, self.bottom):
            for heads in group.values():
                every += heads
        return sorted(set(every))

    def size(self) -> int:
        """Distinct heads of the ranked and random groups (the paper's 68), the named heads aside."""
        ranked = [h for group in (self.top, self.bottom) for heads in group.values() for h in heads]
        return len(set(ranked) | set(self.random))

    def as_dict(self) -> dict:
        return asdict(self)


def teacher_panel(sets: dict, k: int, seed: int, named: list[int] = ()) -> Panel:
    """App. E's panel from the global rankings of head_sets_contrast.json."""
    n = sets["n_layers"] * sets["n_heads"]
    k = min(k, n)
    top, bottom = {}, {}
    for phase in DECISION_KINDS:
        if phase not in sets["phases"]:
            continue
        order = np.argsort(-phase_scores(sets, phase), kind="stable")
        top[phase] = [int(h) for h in order[:k]]
        if phase in ("P1", "P2C"):
            bottom[phase] = [int(h) for h in order[::-1][:k]]
    random = sorted(int(h) for h in note_rng(seed, "read_side:random_panel").choice(n, size=k, replace=False))
    return Panel(top, bottom, random, sorted({int(h) for h in named}))


def named_head_ids(params: dict, n_layers: int, n_heads: int) -> dict[str, list[int]]:
    """Role -> flat ids of the read-side roles params `readers.named_heads` names."""
    from mistill.instrument.readout import head_index, reader_settings

    heads = reader_settings(params).named_heads
    return {role: [head_index(h, n_layers, n_heads) for h in getattr(heads, role)]
            for role in ("region_readers", "prose_readers", "contrastive_readers")}


# ---- pass: the read side ---------------------------------------------------------------------------


def _importance_by_event(path: Path) -> dict[tuple[str, int], np.ndarray]:
    arrays = load_attr(path)
    flat = arrays["importance"].reshape(len(arrays["kinds"]), -1)
    return {(str(k), int(p)): flat[i] for i, (k, p) in enumerate(zip(arrays["kinds"], arrays["positions"]))}


def run_readside(cfg: InstrumentConfig, params: dict, *, model=None, tokenizer=None, limit: int | None = None,
                 force: bool = False, read_dir: str | Path | None = None) -> dict:
    """The panel's attention at every decision event of every note, with each head's importance there.

    The notes, events, attributions and global sets are those of `cfg.out_dir` (HD-001, or HD-002 for the
    shortlist run); `read_dir` (default: read_side.out_dir/readside) is where the reads go."""
    from mistill.instrument.readside import ReadEvent, note_layout, read_note

    side = ReadSide.from_params(params)
    hd = Path(cfg.out_dir)
    sets = load_head_sets(hd / "head_sets_contrast.json")
    L, H = sets["n_layers"], sets["n_heads"]
    named = named_head_ids(params, L, H)
    panel = teacher_panel(sets, side.panel_k, side.seed, [h for hs in named.values() for h in hs])
    heads = panel.heads()
    pairs = [(h // H, h % H) for h in heads]
    out = Path(read_dir) if read_dir is not None else side.pass_dir("readside")
    config = side.digest(json.dumps(panel.as_dict(), sort_keys=True))
    note_pass = NotePass("readside", out, "read.jsonl", read_jsonl, force, config)
    notes = _notes_with_events(cfg, limit)
    if model is None:
        model, tokenizer = load_teacher(cfg, params)
    for trace, events in tqdm(note_pass.shard.mine(notes), desc="read side", unit="note"):
        attr_path = hd / trace.note_id / "attr.npz"
        key = inputs_sha256(trace.prompt, trace.completion, hd / trace.note_id / "events.jsonl", attr_path)
        if not note_pass.needs(trace.note_id, key):
            continue
        if not attr_path.exists():
            note_pass.skip(trace.note_id, "no attr.npz in HD-001 (run the HD-001 stage)")
            continue
        importance = _importance_by_event(attr_path)
        text, ids, offsets, completion_at = model_input(tokenizer, trace)
        layout = note_layout(text, offsets, trace.prompt, completion_at)
        decisions = [e for e in events if e.kind in DECISION_KINDS and (e.kind, e.pos) in importance]
        rows = read_note(model, ids, layout, [ReadEvent(e.kind, e.pos, e.anchor, e.code, e.prefix or "",
                                                        e.near_miss) for e in decisions], pairs)
        for row, e in zip(rows, decisions):
            row["importance"] = [float(importance[(e.kind, e.pos)][h]) for h in row["heads"]]
            row["has_S"], row["has_N"] = bool(e.s_pos), bool(e.n_pos)
        commit_artifact(note_pass.path(trace.note_id), lambda p, rows=rows: write_jsonl(p, rows),
                        {"config_sha256": config, "inputs_sha256": key, "provenance": provenance(params, side.seed)})
        note_pass.computed += 1
    note_pass.finish(params)
    summary = {"panel": panel.as_dict(), "panel_size": panel.size(), "named": named, "n_layers": L, "n_heads": H,
               "notes": [t.note_id for t, _ in notes if t.note_id not in note_pass.skipped]}
    if note_pass.shard.leader:
        write_json(out / "read_panel.json", {**summary, "provenance": provenance(params, side.seed)})
    return summary


def _read_notes(cfg: InstrumentConfig, params: dict, limit: int | None):
    """HD-001's notes with events, its head sets and the named heads as (layer, head) pairs per role."""
    side = ReadSide.from_params(params)
    sets = load_head_sets(Path(cfg.out_dir) / "head_sets_contrast.json")
    H = sets["n_heads"]
    named = {role: [(h // H, h % H) for h in heads]
             for role, heads in named_head_ids(params, sets["n_layers"], H).items()}
    return side, _notes_with_events(cfg, limit), named


def _head_name(head: tuple[int, int]) -> str:
    return f"l{head[0]}h{head[1]}"


def key_reads(named: dict[str, list[tuple[int, int]]]) -> list:
    """What the key-side intervention blocks (App. E, Table 20): each of the first two region readers'
    chapter lines at P1; the first contrastive reader's, and the contrastive pair's, earlier near-miss
    mentions at P2C; and the pair's near-miss inventory line at P2C."""
    from mistill.instrument.keymask import NamedRead

    reads = [NamedRead(f"{_head_name(h)}:region", (h,), "P1", "region") for h in named["region_readers"][:2]]
    contrastive = named["contrastive_readers"]
    if contrastive:
        reads.append(NamedRead(f"{_head_name(contrastive[0])}:near_miss", (contrastive[0],), "P2C", "near_miss"))
    if len(contrastive) > 1:
        pair = tuple(contrastive[:2])
        pair_name = "+".join(_head_name(h) for h in pair)
        reads += [NamedRead(f"{pair_name}:near_miss", pair, "P2C", "near_miss"),
                  NamedRead(f"{pair_name}:near_miss_line", pair, "P2C", "near_miss_line")]
    return reads


# ---- pass: the key-side intervention ------------------------------------------------------------------


def run_keys(cfg: InstrumentConfig, params: dict, *, model=None, tokenizer=None, limit: int | None = None,
             force: bool = False) -> dict:
    """Each named head's named keys blocked at its events, against the empty-key reference, matched
    control keys and the head's mean-ablation -> <out>/<note>/key_intervene.jsonl."""
    from mistill.instrument.hook import HeadHook
    from mistill.instrument.keymask import key_intervention_note
    from mistill.instrument.patching import prefill
    from mistill.instrument.readside import note_layout

    side, notes, named = _read_notes(cfg, params, limit)
    reads = key_reads(named)
    if not reads:
        raise UserError("params readers.named_heads names no region or contrastive readers: nothing to block")
    out = side.pass_dir("keys")
    config = side.digest("keys", json.dumps([asdict(r) for r in reads]), str(cfg.max_batch))
    note_pass = NotePass("keys", out, "key_intervene.jsonl", read_jsonl, force, config)
    if model is None:
        model, tokenizer = load_teacher(cfg, params)
    hook = HeadHook(model)
    try:
        for trace, events in tqdm(note_pass.shard.mine(notes), desc="key blocks", unit="note"):
            key = inputs_sha256(trace.prompt, trace.completion, Path(cfg.out_dir) / trace.note_id / "events.jsonl")
            if not note_pass.needs(trace.note_id, key):
                continue
            text, ids, offsets, completion_at = model_input(tokenizer, trace)
            layout = note_layout(text, offsets, trace.prompt, completion_at)
            pre = prefill(model, hook, ids, reserve=cfg.max_batch)
            rows = key_intervention_note(model, hook, pre, ids, events, layout, reads, seed=side.seed,
                                         note_id=trace.note_id, max_batch=cfg.max_batch)
            del pre
            commit_artifact(note_pass.path(trace.note_id), lambda p, rows=rows: write_jsonl(p, rows),
                            {"config_sha256": config, "inputs_sha256": key,
                             "provenance": provenance(params, side.seed)})
            note_pass.computed += 1
    finally:
        hook.remove()
    note_pass.finish(params)
    summary = {"reads": [asdict(r) for r in reads],
               "notes": [t.note_id for t, _ in notes if t.note_id not in note_pass.skipped]}
    if note_pass.shard.leader:
        write_json(out / "key_reads.json", {**summary, "provenance": provenance(params, side.seed)})
    return summary


# ---- pass: the trace and note edits -----------------------------------------------------------------


def _evidence_problem(prefix_path: Path, evidence_path: Path) -> str | None:
    """Why a note's evidence_edit.jsonl cannot stand beside its committed prefix_edit.jsonl, or None."""
    meta = prefix_path.with_name(prefix_path.name + ".meta.json")
    if not meta.exists():
        return None            # nothing committed yet: the prefix artifact's own state decides
    if not evidence_path.exists():
        return "its evidence_edit.jsonl is missing"
    try:
        recorded = json.loads(meta.read_text()).get("evidence_sha256")
    except json.JSONDecodeError:
        return None            # an unreadable meta is the prefix artifact's own problem
    return None if recorded == file_sha256(evidence_path) else "its evidence_edit.jsonl does not match its meta"


def run_edits(cfg: InstrumentConfig, params: dict, *, model=None, tokenizer=None, limit: int | None = None,
              force: bool = False) -> dict:
    """The earlier sibling mention and the note's distinguishing words edited at a seeded subset of each
    note's contrastive events -> <out>/<note>/prefix_edit.jsonl and evidence_edit.jsonl (one artifact
    pair: both edits share the note's prefill and its event subset)."""
    from mistill.instrument.edits import (
        EditSettings,
        NoteInput,
        evidence_edit_note,
        filler_token_id,
        prefix_edit_note,
    )
    from mistill.instrument.hook import HeadHook
    from mistill.instrument.patching import prefill
    from mistill.world.inventory import load_inventory

    side, notes, named = _read_notes(cfg, params, limit)
    mediation = tuple(named["contrastive_readers"][:2])
    inventory = {c.code: c.description for c in load_inventory(cfg.inventory)}
    out = side.pass_dir("edits")
    config = side.digest("edits", json.dumps(mediation))
    note_pass = NotePass("edits", out, "prefix_edit.jsonl", read_jsonl, force, config)
    if model is None:
        model, tokenizer = load_teacher(cfg, params)
    settings = EditSettings(filler_id=filler_token_id(tokenizer, side.edits.filler), mediation_heads=mediation,
                            seed=side.seed, max_events=side.edits.max_events_per_note)
    hook = HeadHook(model)
    try:
        for trace, events in tqdm(note_pass.shard.mine(notes), desc="edits", unit="note"):
            evidence_path = out / trace.note_id / "evidence_edit.jsonl"
            key = inputs_sha256(trace.prompt, trace.completion, Path(cfg.out_dir) / trace.note_id / "events.jsonl",
                                Path(cfg.inventory))
            if not note_pass.needs(trace.note_id, key, _evidence_problem(note_pass.path(trace.note_id), evidence_path)):
                continue
            note = NoteInput.from_trace(tokenizer, trace)
            # the prefix edits first: they start later in the input, so the cache is only ever cropped
            pre = prefill(model, hook, note.ids, reserve=side.edits.pack_tokens)
            prefix_rows = prefix_edit_note(model, hook, pre, note, events, codes=list(inventory), tokenizer=tokenizer,
                                           settings=settings, pack_tokens=side.edits.pack_tokens)
            evidence_rows = evidence_edit_note(model, hook, pre, note, events, inventory=inventory, settings=settings)
            del pre
            write_jsonl(evidence_path, evidence_rows)
            commit_artifact(note_pass.path(trace.note_id), lambda p, rows=prefix_rows: write_jsonl(p, rows),
                            {"config_sha256": config, "inputs_sha256": key,
                             "evidence_sha256": file_sha256(evidence_path),
                             "provenance": provenance(params, side.seed)})
            note_pass.computed += 1
    finally:
        hook.remove()
    note_pass.finish(params)
    summary = {"mediation_heads": [_head_name(h) for h in mediation], "filler": side.edits.filler,
               "notes": [t.note_id for t, _ in notes if t.note_id not in note_pass.skipped]}
    if note_pass.shard.leader:
        write_json(out / "edits.json", {**summary, "provenance": provenance(params, side.seed)})
    return summary
