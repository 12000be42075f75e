"""The prose-locus passes over the characterization notes (App. F; stage HD-001-locus, R-C6).

    probe      per note: the walk-back of every chapter mention (P1 event), then window attribution
               of every decided mention (window, code, censored) and of every NULL position
               -> <out>/<note>/locus.json, <out>/<note>/window.npz
    calibrate  prose-time and suffix I_c (mentions minus NULL, per note, then the mean over notes)
               -> <out>/head_sets_locus.json (phases "prose" and "suffix", the emission sets' format)
    ablate     per note: the fixed prose-time top-k, the emission top-k, random and bottom sets and
               each mention's own top-k, mean-ablated at the window / suffix positions; the prose-time
               heads' attention on the note at the locus -> <out>/<note>/ablation.json
    follow     per note: the window ablation followed through to the code letter (R-C12, Table 31)
               -> <follow_out_dir>/<note>/follow.json
    swap       per note: the residual swap between window-decided mentions of different chapters
               (R-C12, Figure 5) -> <locus.swap.out_dir>/<note>/swap.json

Each per-note artifact is resumable as the instrument's passes are (a valid artifact computed under
the same settings and inputs is kept).  The events, means and emission sets come from HD-001
(params `instrument.out_dir`); the settings from params `locus`, the swap's from `locus.swap`, and
the other forcing wordings of R-C13's re-runs from `locus.suffix_rerun` (`suffix_variant`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from mistill.errors import UserError
from mistill.instrument.events import Event, LetterVariants, note_rng
from mistill.instrument.global_sets import head_sets, load_head_sets, phase_scores, ranking
from mistill.instrument.hook import HeadHook
from mistill.instrument.passes import (
    InstrumentConfig,
    NotePass,
    commit_artifact,
    inputs_sha256,
    inventory_codes,
    load_events,
    load_teacher,
    load_traces,
    model_input,
)
from mistill.instrument.patching import prefill
from mistill.instrument.readside import QueryKeyCapture, note_layout
from mistill.io import provenance, read_json, read_npz, write_json, write_npz
from mistill.locus.probe import (
    ForcedTarget,
    ProbeMention,
    WalkSettings,
    forced_targets,
    forward_sequences,
    walk_back,
)
from mistill.locus.window import Window, ablated_margins, attribute_windows
from mistill.stats import necessity

DECIDED = ("window", "code", "censored")     # the mentions window attribution covers (App. F)
# words that carry no meaning of their own in a code's description (App. F "own description word")
STRUCTURAL_WORDS = frozenset({"with", "without", "other", "unspecified", "specified", "elsewhere", "classified",
                              "due", "and", "from", "than", "that", "this", "into", "type", "site", "part"})


NESTED = ("swap", "suffix_rerun")      # params locus sections of their own passes (SwapSettings, suffix_variant)


@dataclass(frozen=True)
class LocusSettings:
    out_dir: str
    shortlist_out_dir: str         # the same passes on the shortlist run (HD-002, R-C7)
    follow_out_dir: str            # the follow-through pass (R-C12)
    min_forced_drop: float         # nats: the mentions the follow-through ratio counts (the paper's 1)
    suffix: str                    # the forcing suffix (the paper's suffix B)
    letter_prefix: str             # what the suffix leaves before the letter (" ": the spaced variant)
    theta: float
    step: int
    max_back: int
    extra_steps: int
    window: int                    # W tokens ending at the locus (the paper's 64)
    k: tuple[int, ...]             # ablation set sizes (the paper's 8 and 16)
    overlap_k: tuple[int, ...]     # prose-time vs emission top-k overlaps (the paper's 8, 16, 40)
    layers: tuple[int, int]        # the layer band the prose-time top heads are counted in (the paper's 12-23)
    pool_k: int                    # pooled-weight size of the prose-time set in head_sets_locus.json
    max_batch: int                 # probe / ablation sequences per forward
    attribution_batch: int         # windows per attribution forward (each keeps its graph)
    suffix_leader: str             # the head R-C6 names at the top of the suffix ranking (l<layer>h<head>)
    seed: int = 0

    @classmethod
    def from_params(cls, params: dict) -> LocusSettings:
        section = params.get("locus")
        where = f"params.yaml {params.get('name', '<profile>')}.locus"
        if not isinstance(section, dict):
            raise UserError(f"{where}: missing; it names the forcing suffix, theta, the window and the set sizes")
        section = {k: v for k, v in section.items() if k not in NESTED}
        try:
            settings = cls(**{**section, "k": tuple(section.get("k", ())),
                              "overlap_k": tuple(section.get("overlap_k", ())),
                              "layers": tuple(section.get("layers", ()))})
        except TypeError as err:
            raise UserError(f"{where}: {err}") from None
        if not settings.suffix:
            raise UserError(f"{where}.suffix: empty; the probe needs a suffix that asks for a code")
        for name in ("step", "max_back", "window", "max_batch", "attribution_batch", "pool_k"):
            if not isinstance(getattr(settings, name), int) or getattr(settings, name) < 1:
                raise UserError(f"{where}.{name}: a positive count, got {getattr(settings, name)!r}")
        if not settings.k or any(k < 1 for k in settings.k) or len(settings.layers) != 2:
            raise UserError(f"{where}: k needs positive sizes and layers a [first, last] band")
        return settings

    def suffix_variant(self, params: dict, name: str) -> LocusSettings:
        """These settings with another forcing wording (params locus.suffix_rerun.variants[name]: its suffix and
        letter prefix), for the walk-back re-runs of App. F's suffix robustness (R-C13)."""
        variants = ((params.get("locus") or {}).get("suffix_rerun") or {}).get("variants") or {}
        if name not in variants:
            raise UserError(f"params.yaml locus.suffix_rerun.variants: no wording {name!r} "
                            f"(known: {', '.join(sorted(variants)) or 'none'})")
        variant = variants[name]
        if not isinstance(variant, dict) or not variant.get("suffix") or "letter_prefix" not in variant:
            raise UserError(f"params.yaml locus.suffix_rerun.variants.{name}: needs a suffix and a letter_prefix")
        return dataclasses.replace(self, suffix=str(variant["suffix"]), letter_prefix=str(variant["letter_prefix"]))

    @property
    def walk(self) -> WalkSettings:
        return WalkSettings(self.theta, self.step, self.max_back, self.extra_steps)

    def digest(self, cfg: InstrumentConfig) -> str:
        from mistill.instrument.passes import config_sha256

        where = {"out_dir": None, "shortlist_out_dir": None, "follow_out_dir": None}   # where, not what
        body = json.dumps({**asdict(self), **where, "instrument": config_sha256(cfg)}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()


# ---- one note ---------------------------------------------------------------------------------------


@dataclass
class NoteInput:
    """A note as the probe reads it: tokens, where the trace starts, code mentions, events."""

    note_id: str
    text: str
    ids: list[int]
    floor: int                   # the trace's first token
    mention_end: np.ndarray      # [T] for each token, the index just after the last code mention token before it
    note_tokens: np.ndarray      # [T] bool: the note's tokens in the prompt
    token_char: np.ndarray       # [T] first non-blank character of each token
    events: list

    @classmethod
    def build(cls, tokenizer, trace, events) -> NoteInput:
        from mistill.instrument.readside import _NOTE

        text, ids, offsets, completion_at = model_input(tokenizer, trace)
        layout = note_layout(text, offsets, trace.prompt, completion_at)
        floor = next((j for j, (s, _) in enumerate(offsets) if s >= completion_at), len(ids))
        ends = np.full(len(ids) + 1, floor, dtype=np.int64)
        last = floor
        for j in range(len(ids)):
            ends[j] = last            # code mentions strictly before token j end at `last`
            if j >= floor and layout.mention[j] >= 0:
                last = j + 1
        ends[len(ids)] = last
        return cls(trace.note_id, text, ids, floor, ends, layout.section == _NOTE, layout.token_char, events)

    def word_at(self, token: int) -> str:
        """The whole word around the first character of `token` (lower case), '' outside words."""
        c = int(self.token_char[token])
        if c >= len(self.text) or not self.text[c].isalpha():
            return ""
        start, end = c, c
        while start > 0 and self.text[start - 1].isalpha():
            start -= 1
        while end < len(self.text) and self.text[end].isalpha():
            end += 1
        return self.text[start:end].lower()


def description_words(description: str) -> set[str]:
    """A code description's meaningful words: at least four letters, structural words removed."""
    return {w for w in re.findall(r"[a-z]+", description.lower()) if len(w) >= 4 and w not in STRUCTURAL_WORDS}


class LocusModel:
    """The teacher, its hook and the letter targets the suffix forces."""

    def __init__(self, model, tokenizer, settings: LocusSettings, letters: Sequence[str]):
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self.hook = HeadHook(model)
        variants = LetterVariants(tokenizer)
        ids = {letter: variants.single_token_id(settings.letter_prefix + letter) for letter in letters}
        self.targets: dict[str, ForcedTarget] = forced_targets({k: v for k, v in ids.items() if v is not None})
        if len(self.targets) < 2:
            raise UserError(f"locus: fewer than two inventory letters are single tokens after the prefix "
                            f"{settings.letter_prefix!r}; the forced margin needs competitors")
        self.suffix = list(tokenizer.encode(settings.suffix).ids)

    def reserve(self) -> int:
        s = self.settings
        return max(s.max_batch * len(self.suffix), s.max_batch * (s.window + len(self.suffix)),
                   s.attribution_batch * (s.window + len(self.suffix)))

    def letter_of(self, token_id: int) -> str:
        return self.tokenizer.decode([int(token_id)]).strip()[:1]


def probe_note(lm: LocusModel, note: NoteInput, codes: dict[str, str]) -> tuple[dict, dict[str, np.ndarray]]:
    """The walk-back of every chapter mention and the window attribution of the decided ones and of NULL."""
    s = lm.settings
    pre = prefill(lm.model, lm.hook, note.ids, reserve=lm.reserve())
    mentions, skipped = [], 0
    for i, e in enumerate(note.events):
        if e.kind != "P1":
            continue
        target = lm.targets.get(e.code[0])
        if target is None or e.pos <= note.floor:
            skipped += 1
            continue
        mentions.append(ProbeMention(i, e.pos, note.floor, int(note.mention_end[e.pos]), target))

    def probe(pairs):
        out = []
        for begin in range(0, len(pairs), s.max_batch):
            chunk = pairs[begin:begin + s.max_batch]
            with torch.no_grad():
                logits = forward_sequences(lm.model, lm.hook, pre.cache, [m.pos - d for m, d in chunk],
                                           [lm.suffix] * len(chunk))
            out += [float(m.target.margin(logits[b])) for b, (m, _) in enumerate(chunk)]
        return out

    results = walk_back(probe, mentions, s.walk)
    rows = []
    for m, r in zip(mentions, results):
        e = note.events[m.event]
        row = {**r.to_json(), "code": e.code, "first_code": m.previous_end <= note.floor,
               "trace_start": r.locus == note.floor if r.locus is not None else False}
        if r.outcome == "window":
            word = note.word_at(r.locus - 1)
            row["locus_word"] = word
            row["own_description_word"] = bool(word) and word in description_words(codes.get(e.code, ""))
        rows.append(row)
    # window attribution: decided mentions at their locus, NULL positions at their own position
    windows, kinds, events = [], [], []
    rng = note_rng(s.seed, note.note_id + ":locus-null")
    letters = sorted(lm.targets)
    for m, r in zip(mentions, results):
        if r.outcome in DECIDED:
            windows.append(Window.at(note.ids, r.locus, s.window, note.floor, lm.suffix, m.target))
            kinds.append("mention")
            events.append(m.event)
    for i, e in enumerate(note.events):
        if e.kind == "NULL" and e.pos > note.floor:
            target = lm.targets.get(lm.letter_of(e.target_id)) or lm.targets[letters[rng.integers(len(letters))]]
            windows.append(Window.at(note.ids, e.pos, s.window, note.floor, lm.suffix, target))
            kinds.append("NULL")
            events.append(i)
    parts = [attribute_windows(lm.model, lm.hook, pre.cache, pre.mu, windows[b:b + s.attribution_batch])
             for b in range(0, len(windows), s.attribution_batch)]
    shape = (0, lm.hook.n_layers, lm.hook.n_heads)
    arrays = {"kinds": np.asarray(kinds, dtype="U8"), "events": np.asarray(events, dtype=np.int64),
              "starts": np.asarray([w.start for w in windows], dtype=np.int64),
              "cuts": np.asarray([w.cut for w in windows], dtype=np.int64),
              "margin": np.concatenate([p.margin for p in parts]) if parts else np.zeros(0),
              "window": np.concatenate([p.window for p in parts]) if parts else np.zeros(shape),
              "suffix": np.concatenate([p.suffix for p in parts]) if parts else np.zeros(shape)}
    body = {"note_id": note.note_id, "mentions": rows, "skipped_mentions": skipped,
            "probes": sum(len(r.curve) for r in results), "n_layers": lm.hook.n_layers, "n_heads": lm.hook.n_heads}
    return body, arrays


# ---- the passes ---------------------------------------------------------------------------------------


def _notes(cfg: InstrumentConfig, limit: int | None) -> list:
    traces = load_traces(cfg.traces)[:limit]
    return [t for t in traces if (Path(cfg.out_dir) / t.note_id / "events.jsonl").exists()]


def load_locus(path: Path) -> dict:
    body = read_json(path, "locus")
    if not isinstance(body, dict) or "mentions" not in body:
        raise ValueError("no mentions")
    return body


def run_probe(cfg: InstrumentConfig, settings: LocusSettings, params: dict, *, model=None, tokenizer=None,
              limit: int | None = None, force: bool = False) -> int:
    from mistill.world.inventory import load_inventory

    inventory = {c.code: c.description for c in load_inventory(cfg.inventory)}
    if model is None:
        model, tokenizer = load_teacher(cfg, params)
    lm = LocusModel(model, tokenizer, settings, sorted({c[0] for c in inventory_codes(cfg.inventory)}))
    out = Path(settings.out_dir)
    digest = settings.digest(cfg)
    note_pass = NotePass("locus-probe", out, "locus.json", load_locus, force, digest)
    for trace in tqdm(note_pass.shard.mine(_notes(cfg, limit)), desc="locus-probe", unit="note"):
        events_path = Path(cfg.out_dir) / trace.note_id / "events.jsonl"
        inputs = inputs_sha256(trace.prompt, trace.completion, events_path)
        if not note_pass.needs(trace.note_id, inputs):
            continue
        note = NoteInput.build(tokenizer, trace, load_events(events_path))
        body, arrays = probe_note(lm, note, inventory)
        meta = {"config_sha256": digest, "inputs_sha256": inputs, "provenance": provenance(params, settings.seed)}
        commit_artifact(out / trace.note_id / "window.npz", lambda p, a=arrays: write_npz(p, **a), meta)
        commit_artifact(note_pass.path(trace.note_id), lambda p, b=body: write_json(p, b), meta)
        note_pass.computed += 1
    note_pass.finish(params)
    return note_pass.computed


def note_contrasts(out: Path, note_ids: Sequence[str]) -> dict[str, dict[str, np.ndarray]]:
    """Per note with decided mentions and NULL windows: prose-time and suffix I_c [L*H] (mentions - NULL)."""
    contrasts = {}
    for note_id in note_ids:
        path = out / note_id / "window.npz"
        if not path.exists():
            continue
        arrays = read_npz(path, "window attribution")
        kinds = arrays["kinds"]
        if not (kinds == "mention").any() or not (kinds == "NULL").any():
            continue
        contrasts[note_id] = {
            place: (arrays[place][kinds == "mention"].mean(0) - arrays[place][kinds == "NULL"].mean(0)).reshape(-1)
            for place in ("window", "suffix")}
    return contrasts


def run_calibrate(cfg: InstrumentConfig, settings: LocusSettings, params: dict, *, limit: int | None = None) -> dict:
    out = Path(settings.out_dir)
    notes = [t.note_id for t in _notes(cfg, limit)]
    contrasts = note_contrasts(out, notes)
    if not contrasts:
        raise UserError(f"{out}: no note has both a decided chapter mention and a NULL window; "
                        "run `mistill locus probe` first (or the teacher decides no chapter in the prose)")
    shape = read_json(out / next(iter(contrasts)) / "locus.json", "locus")
    n_layers, n_heads = shape["n_layers"], shape["n_heads"]
    ic = {"prose": np.mean([c["window"] for c in contrasts.values()], axis=0),
          "suffix": np.mean([c["suffix"] for c in contrasts.values()], axis=0)}
    body = head_sets(ic, n_layers, n_heads, pool_k=min(settings.pool_k, n_layers * n_heads))
    write_json(out / "head_sets_locus.json",
               {**body, "notes": sorted(contrasts), "provenance": provenance(params, settings.seed)})
    return body


def _top(scores: np.ndarray, k: int) -> list[int]:
    return ranking(scores)[:k].tolist()


def _bottom(scores: np.ndarray, k: int) -> list[int]:
    return ranking(scores)[::-1][:k].tolist()


def ablation_sets(prose: np.ndarray, emission: np.ndarray, own: np.ndarray, settings: LocusSettings,
                  rng: np.random.Generator) -> dict[str, tuple[list[int], str]]:
    """name -> (flat heads, place) of every ablation of one mention (passes A and B)."""
    small, large = min(settings.k), max(settings.k)
    sets: dict[str, tuple[list[int], str]] = {}
    for k in sorted(set(settings.k)):
        for place in ("window", "suffix", "both"):
            sets[f"prosetime_top{k}_{place}"] = (_top(prose, k), place)
        sets[f"emission_top{k}_window"] = (_top(emission, k), "window")
        sets[f"emission_top{k}_suffix"] = (_top(emission, k), "suffix")
        sets[f"random{k}_window"] = (sorted(rng.choice(prose.size, size=k, replace=False).tolist()), "window")
    sets[f"prosetime_bottom{small}_window"] = (_bottom(prose, small), "window")
    sets[f"emission_bottom{large}_window"] = (_bottom(emission, large), "window")
    sets[f"own_top{large}_window"] = (_top(own, large), "window")
    return sets


def ablate_note(lm: LocusModel, note: NoteInput, locus: dict, window_arrays: dict, prose: np.ndarray,
                emission: np.ndarray) -> dict:
    """Every ablation of every decided mention of one note, and the read at the locus."""
    s = lm.settings
    pre = prefill(lm.model, lm.hook, note.ids, reserve=lm.reserve())
    by_event = {row["event"]: row for row in locus["mentions"]}
    kinds, events = window_arrays["kinds"], window_arrays["events"]
    rows, read_rows = [], []
    rng = note_rng(s.seed, note.note_id + ":locus-random")
    for b in np.flatnonzero(kinds == "mention"):
        event = int(events[b])
        row = by_event[event]
        target = lm.targets[note.events[event].code[0]]
        window = Window.at(note.ids, int(window_arrays["cuts"][b]), s.window, note.floor, lm.suffix, target)
        own = window_arrays["window"][b].reshape(-1)
        sets = ablation_sets(prose, emission, own, s, rng)
        clean, ablated = ablated_margins(lm.model, lm.hook, pre.cache, pre.mu, window, list(sets.values()),
                                         s.max_batch)
        rows.append({"event": event, "outcome": row["outcome"], "clean": clean,
                     "necessity": dict(zip(sets, necessity(np.full(len(ablated), clean), ablated).round(8).tolist()))})
        read_rows.append(window.cut - 1)
    reads = read_at_locus(lm, note, read_rows, _top(prose, min(s.k)), rng)
    return {"note_id": note.note_id, "mentions": rows, "read": reads}


def read_at_locus(lm: LocusModel, note: NoteInput, rows: Sequence[int], prose_heads: Sequence[int],
                  rng: np.random.Generator) -> dict:
    """Attention share on the note at each locus token, of the prose-time top-k and of as many random heads."""
    if not rows:
        return {"prosetime": [], "random": []}
    n_heads = lm.hook.n_heads
    random_heads = sorted(rng.choice(lm.hook.n_layers * n_heads, size=len(prose_heads), replace=False).tolist())
    heads = sorted(set(prose_heads) | set(random_heads))
    capture = QueryKeyCapture(lm.model, {h // n_heads for h in heads}, rows)
    device = next(lm.model.parameters()).device
    with torch.no_grad(), capture.active():
        lm.model(input_ids=torch.as_tensor([note.ids], device=device), use_cache=False, logits_to_keep=1)
    shares = {}
    for r, q in enumerate(rows):
        on_note = note.note_tokens[: q + 1]
        for h in heads:
            probs = capture.attention_rows(h // n_heads, [h % n_heads], r)[0]
            shares[(r, h)] = float(probs[on_note].sum())
    return {"prosetime": [float(np.mean([shares[(r, h)] for h in prose_heads])) for r in range(len(rows))],
            "random": [float(np.mean([shares[(r, h)] for h in random_heads])) for r in range(len(rows))]}


@dataclass
class PassRun:
    """What every locus pass runs under: the instrument run it reads, the settings, the params, the teacher
    (loaded on first use when not given), and the command's note limit and --force."""

    cfg: InstrumentConfig
    settings: LocusSettings
    params: dict
    model: object = None
    tokenizer: object = None
    limit: int | None = None
    force: bool = False


def _per_note(run: PassRun, name: str, out: Path, artifact: str, inputs_of, compute) -> int:
    """One resumable pass over the notes: `inputs_of(note_id)` digests a note's inputs (None: nothing to do for
    it), `compute(lm, note)` its artifact's body, written to <out>/<note>/<artifact>."""
    cfg, settings, params, model, tokenizer = run.cfg, run.settings, run.params, run.model, run.tokenizer
    limit, force = run.limit, run.force
    if model is None:
        model, tokenizer = load_teacher(cfg, params)
    lm = LocusModel(model, tokenizer, settings, sorted({c[0] for c in inventory_codes(cfg.inventory)}))
    digest = settings.digest(cfg)
    note_pass = NotePass(name, out, artifact, None, force, digest)
    for trace in tqdm(note_pass.shard.mine(_notes(cfg, limit)), desc=name, unit="note"):
        inputs = inputs_of(trace.note_id)
        if inputs is None or not note_pass.needs(trace.note_id, inputs):
            continue
        note = NoteInput.build(tokenizer, trace, load_events(Path(cfg.out_dir) / trace.note_id / "events.jsonl"))
        body = compute(lm, note)
        meta = {"config_sha256": digest, "inputs_sha256": inputs, "provenance": provenance(params, settings.seed)}
        commit_artifact(note_pass.path(trace.note_id), lambda p, b=body: write_json(p, b), meta)
        note_pass.computed += 1
    note_pass.finish(params)
    return note_pass.computed


def _rankings(cfg: InstrumentConfig, locus_dir: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """(the locus run's prose-time I_c, the instrument run's emission (P1) I_c, a digest of both).

    The passes that read the two rankings key their notes by the rankings themselves, not by the files'
    bytes: the files carry the code version, and a commit alone must not redo every note."""
    prose = phase_scores(load_head_sets(locus_dir / "head_sets_locus.json"), "prose")
    emission = phase_scores(load_head_sets(Path(cfg.out_dir) / "head_sets_contrast.json"), "P1")
    digest = hashlib.sha256(np.concatenate([prose, emission]).astype("<f8").tobytes()).hexdigest()
    return prose, emission, digest


def run_ablate(cfg: InstrumentConfig, settings: LocusSettings, params: dict, *, model=None, tokenizer=None,
               limit: int | None = None, force: bool = False) -> int:
    """Pass A and B ablations and the read at the locus of a locus run's notes -> <out>/<note>/ablation.json."""
    out = Path(settings.out_dir)
    prose, emission, rankings = _rankings(cfg, out)

    def inputs_of(note_id: str) -> str | None:
        locus_path = out / note_id / "locus.json"
        return inputs_sha256(locus_path, out / note_id / "window.npz", rankings) if locus_path.exists() else None

    def compute(lm: LocusModel, note: NoteInput) -> dict:
        return ablate_note(lm, note, read_json(out / note.note_id / "locus.json", "locus"),
                           read_npz(out / note.note_id / "window.npz", "window attribution"), prose, emission)

    run = PassRun(cfg, settings, params, model, tokenizer, limit, force)
    return _per_note(run, "locus-ablate", out, "ablation.json", inputs_of, compute)


def window_mentions(lm: LocusModel, note: NoteInput, locus: dict) -> list[tuple[dict, Event, Window, ForcedTarget]]:
    """Every window-decided mention of a note's locus.json: (its row, its P1 event, its window ending at the
    locus with the forced target, the natural target and competitors at its letter)."""
    out = []
    for row in locus["mentions"]:
        if row["outcome"] != "window":
            continue
        event = note.events[row["event"]]
        window = Window.at(note.ids, row["pos"] - row["distance"], lm.settings.window, note.floor, lm.suffix,
                           lm.targets[event.code[0]])
        out.append((row, event, window, ForcedTarget(int(event.target_id), tuple(int(c) for c in event.competitor_ids))))
    return out


def follow_note(lm: LocusModel, note: NoteInput, locus: dict, prose: np.ndarray, emission: np.ndarray) -> dict:
    """The follow-through of every window-decided mention of one note (`mistill.locus.follow`)."""
    from mistill.locus.follow import follow_mention

    s = lm.settings
    large = max(s.k)
    rng = note_rng(s.seed, note.note_id + ":follow-random")
    sets = {"prose": _top(prose, large), "emission": _top(emission, large),
            "random": sorted(rng.choice(prose.size, size=large, replace=False).tolist())}
    pre = prefill(lm.model, lm.hook, note.ids, reserve=lm.reserve() + 5 * (s.window + s.max_back))
    rows = []
    for row, event, window, natural in window_mentions(lm, note, locus):
        result = follow_mention(lm.model, lm.hook, pre.cache, pre.mu, note.ids, window, event.pos, natural, sets)
        rows.append({"event": row["event"], "distance": row["distance"], **result})
    return {"note_id": note.note_id, "k": large, "mentions": rows}


def run_follow(cfg: InstrumentConfig, settings: LocusSettings, params: dict, *, model=None, tokenizer=None,
               limit: int | None = None, force: bool = False) -> int:
    """The follow-through pass over a locus run's notes -> <follow_out_dir>/<note>/follow.json (R-C12)."""
    locus_dir = Path(settings.out_dir)
    prose, emission, rankings = _rankings(cfg, locus_dir)

    def inputs_of(note_id: str) -> str | None:
        locus_path = locus_dir / note_id / "locus.json"
        return inputs_sha256(locus_path, rankings) if locus_path.exists() else None

    def compute(lm: LocusModel, note: NoteInput) -> dict:
        return follow_note(lm, note, read_json(locus_dir / note.note_id / "locus.json", "locus"), prose, emission)

    run = PassRun(cfg, settings, params, model, tokenizer, limit, force)
    return _per_note(run, "locus-follow", Path(settings.follow_out_dir), "follow.json", inputs_of, compute)


@dataclass(frozen=True)
class SwapSettings:
    """params `locus.swap`: the residual swap's output, layer grid and tail width (App. F, R-C12)."""

    out_dir: str
    layers: tuple[int, ...]        # residual leaving these decoder layers (the paper names 4 to 28 in steps of 4)
    tail: int                      # window positions the tail swap replaces (the paper's 8)

    @classmethod
    def from_params(cls, params: dict) -> SwapSettings:
        where = f"params.yaml {params.get('name', '<profile>')}.locus.swap"
        section = (params.get("locus") or {}).get("swap")
        if not isinstance(section, dict):
            raise UserError(f"{where}: missing; it names the residual swap's out_dir, layers and tail")
        try:
            settings = cls(str(section["out_dir"]), tuple(int(x) for x in section["layers"]), int(section["tail"]))
        except (KeyError, TypeError, ValueError) as err:
            raise UserError(f"{where}: {err!r}") from None
        if not settings.layers or settings.tail < 1 or list(settings.layers) != sorted(set(settings.layers)):
            raise UserError(f"{where}: layers must be increasing and distinct, tail a positive count")
        return settings


def swap_note(lm: LocusModel, note: NoteInput, locus: dict, swap: SwapSettings) -> dict:
    """The residual swaps of every window-decided mention of one note that has a donor (`mistill.locus.swap`)."""
    from mistill.locus.swap import ResidualStreams, SwapMention, nearest_donor, swap_mention

    s = lm.settings
    if max(swap.layers) >= lm.hook.n_layers:
        raise UserError(f"locus.swap.layers {list(swap.layers)}: the model has {lm.hook.n_layers} layers")
    mentions, letters = [], []
    for row, event, window, natural in window_mentions(lm, note, locus):
        mentions.append((row, SwapMention(window, int(event.pos), natural)))
        letters.append((int(event.pos), event.code[0]))
    rows = []
    if len(set(c for _, c in letters)) < 2:
        return {"note_id": note.note_id, "layers": list(swap.layers), "tail": swap.tail, "mentions": rows}
    longest = max(len(m.natural_sequence(note.ids)) for _, m in mentions) + len(lm.suffix)
    pre = prefill(lm.model, lm.hook, note.ids, reserve=s.max_batch * longest)
    streams = ResidualStreams(lm.model)
    try:
        for i, (row, mention) in enumerate(mentions):
            j = nearest_donor(letters, i)
            if j is None:
                continue
            margins = swap_mention(lm.model, lm.hook, streams, pre.cache, note.ids, mention, mentions[j][1],
                                   swap.layers, swap.tail, s.max_batch)
            rows.append({"event": row["event"], "donor_event": mentions[j][0]["event"], "distance": row["distance"],
                         **margins})
    finally:
        streams.remove()
    return {"note_id": note.note_id, "layers": list(swap.layers), "tail": swap.tail, "mentions": rows}


def run_swap(cfg: InstrumentConfig, settings: LocusSettings, params: dict, *, model=None, tokenizer=None,
             limit: int | None = None, force: bool = False) -> int:
    """The residual swap over a locus run's notes -> <locus.swap.out_dir>/<note>/swap.json (R-C12)."""
    swap = SwapSettings.from_params(params)
    locus_dir = Path(settings.out_dir)
    grid = json.dumps(asdict(swap) | {"out_dir": None}, sort_keys=True)     # what the swap computes, not where

    def inputs_of(note_id: str) -> str | None:
        locus_path = locus_dir / note_id / "locus.json"
        return inputs_sha256(locus_path, grid) if locus_path.exists() else None

    def compute(lm: LocusModel, note: NoteInput) -> dict:
        return swap_note(lm, note, read_json(locus_dir / note.note_id / "locus.json", "locus"), swap)

    run = PassRun(cfg, settings, params, model, tokenizer, limit, force)
    return _per_note(run, "locus-swap", Path(swap.out_dir), "swap.json", inputs_of, compute)


def run_all(cfg: InstrumentConfig, settings: LocusSettings, params: dict, *, limit: int | None = None,
            force: bool = False) -> dict:
    """probe, calibrate and ablate in order, one model load (the HD-001-locus stage)."""
    model, tokenizer = load_teacher(cfg, params)
    run_probe(cfg, settings, params, model=model, tokenizer=tokenizer, limit=limit, force=force)
    body = run_calibrate(cfg, settings, params, limit=limit)
    run_ablate(cfg, settings, params, model=model, tokenizer=tokenizer, limit=limit, force=force)
    return body
