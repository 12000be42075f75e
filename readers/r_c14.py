"""R-C14 (Sec. 3.5, App. B, Table 4): the instruction control, read against four criteria fixed before the run.

The teacher's traces of a seeded draw of the characterization notes, regenerated with the prompt's
narrow-then-decide sentence removed and nothing else changed (stage TR-A), read with the HD-001
pipeline unchanged (HD-A: events, attribution, NULL calibration, knock-in; HD-A-locus: the prose
locus), with HD-001's original global sets knocked into them (KI-A-orig), against HD-001's own cells
on the same notes under the original prompt (HD-001, HD-001-locus):

1. HD-001's global sets, knocked into the new traces, beat random on at least
   `criteria.beat_random_percent` of the notes, chapter (P1) and contrastive (P2C), at top-`k`;
2. the sets re-ranked on the new traces share at least `criteria.min_overlap` of their top-`overlap_k`
   with HD-001's, chapter and contrastive;
3. a window locus exists for a comparable share of chapter mentions (reported beside the share on the
   same notes with the instruction; the paper fixed no number for "comparable");
4. the new prose-time top-`prose_k` shares at most `criteria.max_shared` heads with the new emission
   (P1) top-`prose_k`.

Criteria 1, 2 and 4 are evaluated as pass/fail (`criteria_met`, 1 = met); coverage beside them (valid
traces, median generated tokens against the original traces of the same notes) and Table 4's
knock-in rows: medians over notes at top-`overlap_k` (the paper's k=40) of the original sets, the
re-ranked sets and HD-001's own cells on the same notes, with the random floor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.instrument.global_sets import load_head_sets, phase_scores
from mistill.instrument.knockin import summarize
from mistill.instrument.readout import instrument_dir, run_reader, value
from mistill.io import read_json, read_jsonl
from mistill.locus.passes import LocusSettings
from mistill.locus.readout import LocusRun
from mistill.models.traces import trace_path
from mistill.stats import top_k_overlap

READER = "readers/r_c14.py"
PHASES = ("P1", "P2C")


def keys(params: dict) -> list[str]:
    return ["notes_orig_sets_beat_random_chapter", "notes_orig_sets_beat_random_contrastive",
            "reranked_top40_overlap_chapter", "reranked_top40_overlap_contrastive",
            "window_locus_share_no_instruction", "prosetime_top8_emission_top8_overlap",
            "window_locus_share_with_instruction_same_notes", "prosetime_top8_heads_from_hd001", "valid_traces",
            "median_generated_tokens", "criteria_thresholds",
            # registry extra_keys: Table 4's cells beside the criteria
            "orig_sets_beat_random_notes_of", "criteria_met", "inherited_share_no_instruction_with",
            "knockin_orig_sets_p1_p2c", "knockin_random_p1_p2c", "knockin_reranked_sets_p1_p2c",
            "knockin_hd001_same_notes_p1_p2c", "hd001_same_notes_beat_random_p1_p2c"]


def control_settings(params: dict) -> dict:
    section = params.get("instruction_control")
    if not isinstance(section, dict):
        raise UserError("params.yaml: the active profile has no `instruction_control` section")
    try:
        criteria = section["criteria"]
        return {"out_dir": Path(section["out_dir"]), "orig_sets_dir": Path(section["orig_sets_dir"]),
                "locus_out_dir": Path(section["locus_out_dir"]), "k": int(section["k"]),
                "overlap_k": int(section["overlap_k"]), "prose_k": int(section["prose_k"]),
                "thresholds": [float(criteria["beat_random_percent"]), int(criteria["min_overlap"]),
                               int(criteria["max_shared"])]}
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"params.yaml instruction_control: {err!r} (needs out_dir, orig_sets_dir, locus_out_dir, "
                        "k, overlap_k, prose_k and criteria)") from None


def knockin_at(faithfulness: dict, phase: str, k: int) -> dict:
    """One phase's knock-in cells at top-k of a faithfulness summary (`mistill.instrument.knockin.summarize`)."""
    try:
        return faithfulness["phases"][phase]["bins"][str(k)]["knockin"]
    except KeyError:
        raise UserError(f"no {phase} knock-in cell at k={k}: k must be one of params instrument.knockin.bins") from None


def beats_random(faithfulness: dict, phase: str, k: int) -> tuple[int, int]:
    """(notes whose top-k knock-in is above the random set's, notes compared)."""
    test = knockin_at(faithfulness, phase, k)["vs"]["random"]
    return int(test["notes_top_above"]), int(test["notes"])


def locus_subset(run: LocusRun, note_ids: set[str]) -> list[dict]:
    """The chapter mentions of a locus run's notes among `note_ids`."""
    return [m for body in run.bodies if body["note_id"] in note_ids for m in body["mentions"]]


def outcome_percent(mentions: list[dict], outcome: str) -> float:
    return 100.0 * sum(m["outcome"] == outcome for m in mentions) / len(mentions) if mentions else float("nan")


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    c = control_settings(params)
    locus = LocusSettings.from_params(params)
    hd001 = instrument_dir(params)
    traces_path, original_path = trace_path(params, "TR-A"), trace_path(params, "TR-006")
    for path in (traces_path, original_path):
        if not path.exists():
            raise UserError(f"{path}: missing; run `dvc repro R-C14` (stages TR-A, HD-A, KI-A-orig, HD-A-locus)")
    traces = read_jsonl(traces_path)
    drawn = {t["note_id"] for t in traces}
    original = [t for t in read_jsonl(original_path) if t["note_id"] in drawn]
    orig_sets = read_json(c["orig_sets_dir"] / "faithfulness2.json", "knock-in of HD-001's sets (KI-A-orig)")
    reranked = read_json(c["out_dir"] / "faithfulness2.json", "knock-in of the re-ranked sets (HD-A)")
    rows = {n: read_jsonl(hd001 / n / "patch2.jsonl") for n in sorted(drawn) if (hd001 / n / "patch2.jsonl").exists()}
    if not rows:
        raise UserError(f"{hd001}: no patch2.jsonl of any of the control's notes")
    same_notes = summarize(rows, bins=sorted({c["k"], c["overlap_k"]}), min_range=float(orig_sets.get("min_range", 1.0)))
    new_sets = load_head_sets(c["out_dir"] / "head_sets_contrast.json")
    old_sets = load_head_sets(hd001 / "head_sets_contrast.json")
    new_locus, old_locus = LocusRun.load(c["locus_out_dir"]), LocusRun.load(locus.out_dir)
    new_mentions, old_mentions = new_locus.mentions, locus_subset(old_locus, drawn)

    k, ok, pk = c["k"], c["overlap_k"], c["prose_k"]
    beat = {p: beats_random(orig_sets, p, k) for p in PHASES}
    overlap = {p: top_k_overlap(phase_scores(new_sets, p), phase_scores(old_sets, p), ok) for p in PHASES}
    prose_new = new_locus.scores("prose")
    shared = top_k_overlap(prose_new, phase_scores(new_sets, "P1"), pk)
    from_hd001 = top_k_overlap(prose_new, old_locus.scores("prose"), pk)
    percent_needed, min_overlap, max_shared = c["thresholds"]
    met = [all(100.0 * above >= percent_needed * notes and notes > 0 for above, notes in beat.values()),
           all(n >= min_overlap for n in overlap.values()), shared <= max_shared]

    ki, hd, tr, lo = (f"{c['orig_sets_dir']}/faithfulness2.json", f"{c['out_dir']}/head_sets_contrast.json",
                      str(traces_path), f"{c['locus_out_dir']}/*/locus.json")
    on = f"{len(drawn)} drawn notes"
    v = {"notes_orig_sets_beat_random_chapter": value(
            beat["P1"][0], f"count of {beat['P1'][1]} notes, HD-001's P1 top-{k} knocked into the new traces above "
            f"{k} random heads", ki),
         "notes_orig_sets_beat_random_contrastive": value(
            beat["P2C"][0], f"count of {beat['P2C'][1]} notes, HD-001's P2C top-{k} knocked into the new traces "
            f"above {k} random heads", ki),
         "orig_sets_beat_random_notes_of": value([beat["P1"][1], beat["P2C"][1]], "notes with P1, P2C events", ki),
         "reranked_top40_overlap_chapter": value(overlap["P1"], f"count of {ok}: P1 top-{ok} re-ranked on the new "
                                                 "traces shared with HD-001's", hd),
         "reranked_top40_overlap_contrastive": value(overlap["P2C"], f"count of {ok}: P2C top-{ok} re-ranked on "
                                                     "the new traces shared with HD-001's", hd),
         "window_locus_share_no_instruction": value(outcome_percent(new_mentions, "window"),
                                                    f"percent of {len(new_mentions)} chapter mentions", lo),
         "window_locus_share_with_instruction_same_notes": value(
            outcome_percent(old_mentions, "window"), f"percent of {len(old_mentions)} chapter mentions of the same "
            "notes under the original prompt", f"{locus.out_dir}/*/locus.json"),
         "inherited_share_no_instruction_with": value(
            [outcome_percent(new_mentions, "inherited"), outcome_percent(old_mentions, "inherited")],
            "percent of chapter mentions inherited (no instruction, with it on the same notes)", lo),
         "prosetime_top8_emission_top8_overlap": value(shared, f"count of {pk}: the new prose-time top-{pk} shared "
                                                       f"with the new emission (P1) top-{pk}", lo),
         "prosetime_top8_heads_from_hd001": value(from_hd001, f"count of {pk}: the new prose-time top-{pk} shared "
                                                  f"with HD-001's prose-time top-{pk}", lo),
         "valid_traces": value(sum(bool(t["valid"]) for t in traces), f"count of {len(traces)} traces", tr),
         "median_generated_tokens": value(
            [float(np.median([t["n_new_tokens"] for t in traces])),
             float(np.median([t["n_new_tokens"] for t in original]))],
            f"tokens, median over the {on} (no instruction, original)", tr),
         "criteria_thresholds": value(c["thresholds"], f"pre-fixed: percent of notes beating random; top-{ok} "
                                      f"overlap at least; top-{pk} heads shared at most", "params.yaml"),
         "criteria_met": value([int(m) for m in met], "1 met, 0 not: criteria 1 (beat random), 2 (overlap), "
                               "4 (prose-time apart from emission)", ki)}
    for name, source in (("orig_sets", orig_sets), ("reranked_sets", reranked), ("hd001_same_notes", same_notes)):
        v[f"knockin_{name}_p1_p2c"] = value([knockin_at(source, p, ok)["top"]["median"] for p in PHASES],
                                            f"median over notes of per-note knock-in recovery, top-{ok}, P1 and P2C",
                                            ki if name == "orig_sets" else hd if name == "reranked_sets" else hd001)
    own = {p: beats_random(same_notes, p, k) for p in PHASES}
    v["hd001_same_notes_beat_random_p1_p2c"] = value(
        [own["P1"][0], own["P2C"][0]], f"counts of {own['P1'][1]} and {own['P2C'][1]} notes: HD-001's own top-{k} above "
        f"{k} random heads on the same notes under the original prompt (P1, P2C)", hd001)
    v["knockin_random_p1_p2c"] = value([knockin_at(orig_sets, p, ok)["random"]["median"] for p in PHASES],
                                       f"median over notes of {ok} random heads knocked into the new traces", ki)
    inputs = [traces_path, original_path, c["orig_sets_dir"] / "faithfulness2.json", c["out_dir"] / "faithfulness2.json",
              c["out_dir"] / "head_sets_contrast.json", hd001 / "head_sets_contrast.json",
              *(hd001 / n / "patch2.jsonl" for n in rows), *new_locus.inputs(),
              *(path for path in old_locus.loci if path.parent.name in drawn), old_locus.sets_path]
    return v, inputs


def main() -> int:
    return run_reader("R-C14", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
