"""The isolation pass: a note's own top-k heads kept alone, and the same heads removed (App. D, "Isolation is
not a sufficiency test").

The paper's first attribution pass tested sufficiency by isolation.  At each chapter decision (a P1 event,
decided at q = pos - 1), with the note's own ranking of heads (its I_c over its own P1 events, the row of
HD-001's calibration.npz that the knock-in pass's own-ranking sets take), for every k of params
`isolation.bins`:

    isolation   keep only the own top-k and mean-ablate every other head at q:
                    share = margin_isolated / margin_clean             (1: the clean margin; < 0: flipped)
    necessity   mean-ablate only the own top-k at q (the knock-in pass's necessity):
                    necessity = (margin_clean - margin_ablated) / margin_clean

Each is read as a note's mean over its P1 events, then the median over notes (`summarize`), as the knock-in
summaries are.  Events with a zero clean margin have no ratio and are left out.  The paper's margin that
remains under isolation is about -0.6 of the clean margin at every k while its necessity bins read 0.29 to
1.42 for k = 3 to 100: mean-ablating every other head removes the residual stream's base, not only the heads
that argue for the competitors, so isolation asks whether the set works without the rest of the model.
Knock-in (knockin.py), which holds everything outside the set at the corrupted run's values, is the
sufficiency test the paper uses.

The pass (`run_isolation`, stage HD-001-isolation): per note, one prefill (the cache and each head's mean
over the note, as every exact patch of App. C uses), then every variant of every P1 event as a token of
batched forwards against that cache (patching.run_variants): per event nothing replaced, then per k the
isolation set, then per k the necessity set.  Writes <out>/<note>/isolation.npz: bins [K], positions [E]
(the events' `pos`), target_ids [E], margin_clean [E], margin_isolated [E, K], margin_ablated [E, K],
ranking [L * H] (the own ranking, flat layer * H + head indices, best first); and <out>/isolation.json, the
summary over notes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from mistill.errors import UserError
from mistill.instrument.events import Event
from mistill.instrument.global_sets import ranking
from mistill.instrument.hook import HeadHook
from mistill.instrument.margin import margin
from mistill.instrument.passes import (
    NotePass,
    artifact_state,
    commit_artifact,
    config_sha256,
    inputs_sha256,
    load_events,
    load_teacher,
    load_traces,
    model_input,
)
from mistill.instrument.patching import EventVariants, prefill, run_variants
from mistill.io import provenance, read_npz, write_json, write_npz
from mistill.params import profile_section

ARTIFACT = "isolation.npz"
SUMMARY = "isolation.json"
PHASE = "P1"   # App. D reports isolation at the chapter decision
ARRAYS = ("bins", "positions", "target_ids", "margin_clean", "margin_isolated", "margin_ablated", "ranking")


@dataclass(frozen=True)
class IsolationSettings:
    """The profile's `isolation` section: where the pass writes and its set sizes."""

    out_dir: str
    bins: tuple[int, ...]

    @classmethod
    def from_params(cls, params: dict) -> IsolationSettings:
        where, section = profile_section(params, "isolation",
                                         "it names the isolation pass's output and set sizes (App. D)")
        unknown = sorted(set(section) - {"out_dir", "bins"})
        if unknown:
            raise UserError(f"{where}: unknown keys {', '.join(unknown)}")
        bins = section.get("bins")
        if (not isinstance(bins, list) or not bins or not all(isinstance(k, int) and k >= 1 for k in bins)
                or sorted(set(bins)) != bins):
            raise UserError(f"{where}.bins: must be increasing positive set sizes, got {bins!r}")
        if not isinstance(section.get("out_dir"), str) or not section["out_dir"]:
            raise UserError(f"{where}.out_dir: must be a directory path")
        return cls(section["out_dir"], tuple(bins))


def own_top_masks(own_scores: np.ndarray, bins: Sequence[int], n_layers: int, n_heads: int
                  ) -> dict[int, torch.Tensor]:
    """k -> [L, H] mask of the note's own top-k, ranked as the knock-in pass ranks its own-ranking sets."""
    order = ranking(np.asarray(own_scores).reshape(-1))
    masks = {}
    for k in bins:
        mask = torch.zeros(n_layers * n_heads, dtype=torch.bool)
        mask[torch.as_tensor(order[:k].copy(), dtype=torch.long)] = True
        masks[k] = mask.view(n_layers, n_heads)
    return masks


@torch.no_grad()
def isolation_note(model, hook: HeadHook, ids: Sequence[int], events: Sequence[Event], own_scores: np.ndarray,
                   bins: Sequence[int], *, max_batch: int = 64) -> dict[str, np.ndarray]:
    """The arrays of isolation.npz for one note: at every P1 event, the clean margin and, per k, the margin
    with only the own top-k left (isolation) and with the own top-k mean-ablated (necessity)."""
    L, H = hook.n_layers, hook.n_heads
    too_large = [k for k in bins if k > L * H]
    if too_large:
        raise UserError(f"isolation bins {too_large}: larger than the teacher's {L * H} heads")
    p1 = [e for e in events if e.kind == PHASE]
    order = ranking(np.asarray(own_scores).reshape(-1))
    arrays = {"bins": np.asarray(bins, dtype=np.int64), "ranking": order.astype(np.int64),
              "positions": np.asarray([e.pos for e in p1], dtype=np.int64),
              "target_ids": np.asarray([e.target_id for e in p1], dtype=np.int64)}
    if not p1:
        empty = np.zeros((0, len(bins)))
        return {**arrays, "margin_clean": np.zeros(0), "margin_isolated": empty, "margin_ablated": empty.copy()}
    top = own_top_masks(own_scores, bins, L, H)
    nothing = torch.zeros(L, H, dtype=torch.bool)
    # per event: the clean token at q, nothing replaced; every head but the top-k replaced; the top-k replaced
    sets = {i: [nothing, *(~top[k] for k in bins), *(top[k] for k in bins)] for i in range(len(p1))}
    clean = prefill(model, hook, ids, reserve=max_batch)
    variants = EventVariants.build({i: e.pos - 1 for i, e in enumerate(p1)},
                                   {i: ids[e.pos - 1] for i, e in enumerate(p1)}, sets)
    variants.values = clean.mu
    logits = run_variants(model, hook, clean.cache, variants, max_batch).logits
    del clean
    rows = []
    for i, e in enumerate(p1):
        lo, hi = variants.spans[i]
        rows.append(margin(logits[lo:hi], e.target_id, e.competitor_ids).double().cpu().numpy())
    margins, K = np.stack(rows), len(bins)   # [E, 1 + 2K]: clean, isolated per k, ablated per k
    return {**arrays, "margin_clean": margins[:, 0], "margin_isolated": margins[:, 1:1 + K],
            "margin_ablated": margins[:, 1 + K:]}


def load_isolation(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    for key in ARRAYS:
        if key not in arrays:
            raise ValueError(f"missing array {key}")
    n_events, n_bins = len(arrays["positions"]), len(arrays["bins"])
    for key in ("margin_isolated", "margin_ablated"):
        if arrays[key].shape != (n_events, n_bins):
            raise ValueError(f"{key} has shape {arrays[key].shape}, not ({n_events}, {n_bins})")
    return arrays


# ---- aggregation over notes ---------------------------------------------------------------------------


def summarize(arrays_by_note: Mapping[str, Mapping[str, np.ndarray]], bins: Sequence[int]) -> dict:
    """Per k: the median over notes of per-note means of the isolation share and of necessity, their 10th and
    90th percentiles over notes, and how many notes and events they rest on."""
    from mistill.stats import median_of_note_means, necessity

    out: dict = {"phase": PHASE, "bins": [int(k) for k in bins], "by_k": {}}
    notes, clean, isolated, ablated = [], [], [], []
    zero = 0
    for note, arrays in arrays_by_note.items():
        if [int(k) for k in arrays["bins"]] != out["bins"]:
            raise UserError(f"note {note}: isolation.npz has bins {arrays['bins'].tolist()}, not {out['bins']}; "
                            "rerun the isolation pass")
        keep = arrays["margin_clean"] != 0      # no ratio to a zero clean margin
        zero += int((~keep).sum())
        notes += [note] * int(keep.sum())
        clean.append(arrays["margin_clean"][keep])
        isolated.append(arrays["margin_isolated"][keep])
        ablated.append(arrays["margin_ablated"][keep])
    if not notes:
        raise UserError("isolation: no P1 event with a nonzero clean margin in any note")
    clean, isolated, ablated = np.concatenate(clean), np.concatenate(isolated), np.concatenate(ablated)
    out.update(n_notes=len(set(notes)), n_events=len(notes), zero_clean_margin_events=zero)
    for j, k in enumerate(out["bins"]):
        cell = {}
        for name, per_event in (("isolation_share", isolated[:, j] / clean),
                                ("necessity", necessity(clean, ablated[:, j]))):
            means = median_of_note_means(per_event, notes).note_means
            cell[name] = {"median": float(np.median(means)), "n_notes": int(means.size),
                          "p10": float(np.percentile(means, 10)), "p90": float(np.percentile(means, 90))}
        out["by_k"][str(k)] = cell
    return out


# ---- the pass ---------------------------------------------------------------------------------------------


def own_rankings(path: Path) -> dict[str, np.ndarray]:
    """note -> its own P1 I_c [L * H], from the calibration's per-note arrays."""
    data = read_npz(path, "calibration arrays")
    if f"ic_{PHASE}" not in data:
        raise UserError(f"{path}: no per-note {PHASE} I_c; rerun `mistill instrument calibrate`")
    return dict(zip(data[f"notes_{PHASE}"].tolist(), data[f"ic_{PHASE}"]))


def run_isolation(cfg, params: dict, *, model=None, tokenizer=None, limit: int | None = None,
                  force: bool = False) -> dict:
    """The pass over the notes of cfg.out_dir (HD-001) -> <isolation.out_dir>/<note>/isolation.npz and the
    summary over notes, <isolation.out_dir>/isolation.json."""
    settings = IsolationSettings.from_params(params)
    hd, out = Path(cfg.out_dir), Path(settings.out_dir)
    own = own_rankings(hd / "calibration.npz")
    config = config_sha256(cfg, isolation_bins=list(settings.bins))
    note_pass = NotePass("isolation", out, ARTIFACT, load_isolation, force, config)
    traces = load_traces(cfg.traces)[:limit]
    hook = None
    try:
        for trace in tqdm(traces, desc="isolation", unit="note"):
            events_path = hd / trace.note_id / "events.jsonl"
            if artifact_state(events_path, load_events) != "valid":
                note_pass.skip(trace.note_id, "no valid events.jsonl")
                continue
            if trace.note_id not in own:
                note_pass.skip(trace.note_id, f"no own {PHASE} ranking in calibration.npz")
                continue
            # the sets by what they rank: a calibration that reorders no head of this note changes nothing
            order = json.dumps(ranking(own[trace.note_id].reshape(-1)).tolist())
            digest = inputs_sha256(trace.prompt, trace.completion, events_path, order)
            if not note_pass.needs(trace.note_id, digest):
                continue
            if model is None:
                model, tokenizer = load_teacher(cfg, params)
            if hook is None:
                hook = HeadHook(model)
            _, ids, _, _ = model_input(tokenizer, trace)
            arrays = isolation_note(model, hook, ids, load_events(events_path), own[trace.note_id],
                                    settings.bins, max_batch=cfg.max_batch)
            commit_artifact(note_pass.path(trace.note_id), lambda p, a=arrays: write_npz(p, **a),
                            {"bins": list(settings.bins), "config_sha256": config, "inputs_sha256": digest,
                             "provenance": provenance(params, cfg.seed)})
            note_pass.computed += 1
    finally:
        if hook is not None:
            hook.remove()
    note_pass.finish(params)
    done = [t.note_id for t in traces if t.note_id not in note_pass.skipped]
    summary = summarize({n: load_isolation(note_pass.path(n)) for n in done}, settings.bins)
    write_json(out / SUMMARY, {**summary, "provenance": provenance(params, cfg.seed)})
    return summary
