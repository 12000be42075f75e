"""What the prose-time heads read at the locus (App. F, Table 33; R-C6).

"Attention rows were read at the locus token in the natural context (no suffix) for four 16-head groups:
the prose-time top-16, the emission top-16, the prose-time bottom-16 and 16 random heads (Table 33). The
prose-time set's share on the emitted chapter's lines beats the random panel's on 84 of 100 notes."

At every window-decided mention of a locus run (`<locus out_dir>/<note>/locus.json`), one forward of the
note in its natural context (the trace as written, no forcing suffix) reads the attention row at the
locus token q = cut - 1 of each group's heads, with the read side's categories (`instrument.readside`)
for a chapter decision of the mention's code: the region is the emitted chapter's lines (App. E: own
line, category, chapter and near-miss lines). Per group and locus, the mean over the group's heads of the
share on the region, on other chapters' lines, on the note, on the reasoning prose and on the sink, the
region lift and n_eff over inventory tokens (`readside.region_lift`).

The groups have the locus run's larger set size (params locus.k; the paper's 16): the prose-time top and
bottom by the locus run's calibrated prose ranking, the emission top by the instrument run's P1 ranking,
and as many random heads, one seeded draw per note.  Summary (`summarize_locus_reads`): per group the mean
over loci of each measure (Table 33), and per note the prose-time top's mean region share against the
random group's (the notes where it is higher, with a sign test).

Descriptive, as in the paper: attention is not intervened on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from mistill.instrument.events import note_rng
from mistill.instrument.passes import InstrumentConfig, inputs_sha256, load_traces, model_input
from mistill.instrument.readside import CAT, REGION_CATEGORIES, ReadEvent, note_layout, read_note
from mistill.io import provenance, read_json, write_json

ARTIFACT = "read.json"
SUMMARY = "locus_read.json"
GROUPS = ("prosetime_top", "emission_top", "prosetime_bottom", "random")
# Table 33's columns: shares of all attention, then the region's lift and n_eff over inventory tokens
SHARES = {"region": REGION_CATEGORIES, "other_chapters": ("other_chapter_lines",), "note": ("note",),
          "reasoning_prose": ("trace_prose",), "sink": ("sink",)}
MEASURES = (*SHARES, "lift", "n_eff")


def read_dir(locus_dir: str | Path) -> Path:
    """Where the read of a locus run goes: beside it (<locus out_dir>-read)."""
    return Path(f"{locus_dir}-read")


def group_size(settings, n_heads_total: int) -> int:
    """The groups' size: the larger of params locus.k (the paper's 16), at most every head."""
    return min(max(settings.k), n_heads_total)


def locus_groups(prose: np.ndarray, emission: np.ndarray, k: int, rng: np.random.Generator) -> dict[str, list[int]]:
    """The four groups of flat head ids (layer * n_heads + head)."""
    from mistill.instrument.global_sets import ranking

    return {"prosetime_top": ranking(prose)[:k].tolist(), "emission_top": ranking(emission)[:k].tolist(),
            "prosetime_bottom": ranking(prose)[::-1][:k].tolist(),
            "random": sorted(rng.choice(prose.size, size=k, replace=False).tolist())}


def read_locus_note(lm, trace, note, locus: dict, prose: np.ndarray, emission: np.ndarray) -> dict:
    """Every group's read at each window-decided mention's locus of one note."""
    from mistill.locus.passes import window_mentions

    rng = note_rng(lm.settings.seed, note.note_id + ":locus-read-random")
    groups = locus_groups(prose, emission, group_size(lm.settings, prose.size), rng)
    text, ids, offsets, completion_at = model_input(lm.tokenizer, trace)
    layout = note_layout(text, offsets, trace.prompt, completion_at)
    mentions = window_mentions(lm, note, locus)
    events = [ReadEvent("P1", window.cut, int(event.anchor), event.code) for _, event, window, _ in mentions]
    n_heads = lm.hook.n_heads
    heads = sorted({h for group in groups.values() for h in group})
    rows = read_note(lm.model, ids, layout, events, [(h // n_heads, h % n_heads) for h in heads])
    return {"note_id": note.note_id, "groups": groups,
            "loci": [{"event": row["event"], **read} for (row, *_), read in zip(mentions, rows)]}


def locus_values(locus: Mapping, heads: Sequence[int]) -> dict[str, float]:
    """One locus, one group: each measure's mean over the group's heads (lift and n_eff where defined)."""
    index = {h: i for i, h in enumerate(locus["heads"])}
    shares = np.asarray([locus["shares"][index[h]] for h in heads], dtype=float)
    out = {name: float(shares[:, [CAT[c] for c in cats]].sum(1).mean()) for name, cats in SHARES.items()}
    for name in ("lift", "n_eff"):
        defined = [locus[name][index[h]] for h in heads if locus[name][index[h]] is not None]
        out[name] = float(np.mean(defined)) if defined else float("nan")
    return out


def summarize_locus_reads(notes: Mapping[str, Mapping]) -> dict:
    """Per group, each measure's mean over loci (NaN-free loci for lift and n_eff); per note, the prose-time
    top's mean region share against the random group's."""
    from mistill.stats import sign_test

    per_locus: dict[str, list[dict[str, float]]] = {g: [] for g in GROUPS}
    per_note: dict[str, dict[str, float]] = {}
    for note_id, body in notes.items():
        by_group = {g: [locus_values(locus, body["groups"][g]) for locus in body["loci"]] for g in GROUPS}
        for g in GROUPS:
            per_locus[g] += by_group[g]
        if body["loci"]:
            per_note[note_id] = {g: float(np.mean([v["region"] for v in by_group[g]])) for g in GROUPS}
    groups = {}
    for g in GROUPS:
        groups[g] = {"loci": len(per_locus[g])}
        for m in MEASURES:
            col = np.asarray([v[m] for v in per_locus[g]], dtype=float)
            col = col[~np.isnan(col)]
            groups[g][m] = float(col.mean()) if col.size else None
    shared = sorted(per_note)
    test = sign_test([per_note[n]["prosetime_top"] for n in shared], [per_note[n]["random"] for n in shared])
    return {"groups": groups, "notes": len(shared),
            "prosetime_region_beats_random": {"notes_higher": test.n_positive, "notes_lower": test.n_negative,
                                              "notes": test.n, "p_value": test.p_value}}


def run_locus_read(cfg: InstrumentConfig, settings, params: dict, *, model=None, tokenizer=None,
                   limit: int | None = None, force: bool = False) -> dict:
    """The read at every window-decided locus of a locus run -> <locus out_dir>-read/<note>/read.json and
    the summary locus_read.json."""
    from mistill.locus.passes import PassRun, _per_note, _rankings

    locus_dir, out = Path(settings.out_dir), read_dir(settings.out_dir)
    prose, emission, rankings = _rankings(cfg, locus_dir)
    traces = {t.note_id: t for t in load_traces(cfg.traces)}

    def inputs_of(note_id: str) -> str | None:
        locus_path = locus_dir / note_id / "locus.json"
        return inputs_sha256(locus_path, rankings) if locus_path.exists() else None

    def compute(lm, note) -> dict:
        return read_locus_note(lm, traces[note.note_id], note, read_json(locus_dir / note.note_id / "locus.json",
                                                                         "locus"), prose, emission)

    _per_note(PassRun(cfg, settings, params, model, tokenizer, limit, force), "locus-read", out, ARTIFACT,
              inputs_of, compute)
    notes = {p.parent.name: read_json(p, "locus read") for p in sorted(out.glob(f"*/{ARTIFACT}"))}
    summary = summarize_locus_reads(notes)
    write_json(out / SUMMARY, {**summary, "k": group_size(settings, prose.size),
                               "provenance": provenance(params, settings.seed)})
    return summary
