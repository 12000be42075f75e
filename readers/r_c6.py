"""R-C6 (Sec. 3.4, App. F, Tables 26-33): the prose locus and the prose-time head set.

Reads stage HD-001-locus (`mistill locus all`, params `locus`):

* outcomes of the walk-back over every probed chapter mention (P1 event): window, inherited (the
  note alone included), never decisive, at the code token, censored, as percents of the mentions;
  the locus distance of window-decided mentions (median, 10th-90th percentiles, first codes), the
  jump across the refined crossing, the share of window loci on a word of the code's own description;
* the prose-time set (head_sets_locus.json, window I_c against NULL windows): its top heads in the
  middle layer band, its overlaps with and Spearman against the emission (P1) ranking of HD-001;
* the ablations (ablation.json): per note the mean necessity over its decided mentions, then the
  median over notes, of the prose-time, emission, random, bottom and own sets at the window-only,
  suffix-only or both positions; the notes where the prose-time set beats the random one;
* the read at the locus: the prose-time heads' and random heads' attention share on the note.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.instrument.global_sets import load_head_sets, phase_scores, ranking
from mistill.instrument.readout import head_index, instrument_dir, run_reader, value
from mistill.io import read_json
from mistill.locus.passes import DECIDED, LocusSettings
from mistill.locus.read import GROUPS, MEASURES, read_dir
from mistill.locus.read import SUMMARY as READ_SUMMARY
from mistill.locus.readout import LocusRun
from mistill.stats import spearman_over_heads, top_k_overlap

READER = "readers/r_c6.py"


def sizes(params: dict) -> tuple[int, int, int, tuple[int, int], str]:
    s = LocusSettings.from_params(params)
    band = (int(s.layers[0]), int(s.layers[1]))
    return min(s.k), max(s.k), s.pool_k, band, s.suffix_leader


def keys(params: dict) -> list[str]:
    """Every key this reader writes under `params` (set sizes, layer band and the named head from params)."""
    small, large, pool, (first, last), leader = sizes(params)
    overlap = LocusSettings.from_params(params).overlap_k
    return ["window_locus_share", "inherited_share", "never_decisive_share", "median_locus_distance",
            f"prosetime_top{small}_window_only_necessity", f"random{small}_window_only_necessity",
            "notes_prosetime_above_random", f"emission_top{large}_window_only_necessity",
            "prosetime_note_attention_share", "locus_jump", "locus_at_own_description_word", "locus_distance_p10_p90",
            "first_code_median_locus_distance", "per_note_window_share", f"prosetime_top{pool}_in_layers_{first}_{last}",
            "prosetime_emission_overlap_" + "_".join(f"top{k}" for k in overlap), "prosetime_emission_ic_spearman",
            f"prosetime_top{large}_window_only", f"emission_top{large}_suffix_only", f"prosetime_top{large}_suffix_only",
            f"prosetime_top{small}_suffix_only", "pass_a_own_set_window_only", "attributed_mentions", "censored_share",
            "probes_total", "decisive_at_code_suffix_b", "note_alone_decisive", "random_heads_note_share_at_locus",
            f"suffix_ranking_top_ic_{leader}", "notes_prosetime_region_beats_random",
            *(f"table33_{group}" for group in GROUPS)]


def percent(count: int, total: int) -> float:
    return 100.0 * count / total if total else float("nan")


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    settings = LocusSettings.from_params(params)
    small, large, pool, (first, last), leader = sizes(params)
    run = LocusRun.load(settings.out_dir)
    out, bodies, mentions = run.out, run.bodies, run.mentions
    n = len(mentions)
    outcome = run.outcome_counts()
    window = run.window()
    distances = np.array([m["distance"] for m in window], dtype=float)
    on = f"{n} chapter mentions of {len(bodies)} notes"
    art_locus = f"{out}/*/locus.json"
    v = {
        "window_locus_share": value(percent(outcome["window"], n), f"percent of {on} decided in the window", art_locus),
        "inherited_share": value(percent(outcome["inherited"], n), f"percent of {on} inherited (locus at or before "
                                 "the previous code's end; the note alone for a first code)", art_locus),
        "never_decisive_share": value(percent(outcome["never"], n), f"percent of {on} never decisive "
                                      f"(forced margin < {settings.theta} nats with the cut before the letter)", art_locus),
        "censored_share": value(percent(outcome["censored"], n),
                                f"percent of {on} still decisive {settings.max_back} tokens back", art_locus),
        "decisive_at_code_suffix_b": value(percent(n - outcome["never"], n), f"percent of {on} decisive at the code "
                                           f"token under the forcing suffix (params locus.suffix), theta "
                                           f"{settings.theta}", art_locus),
        "note_alone_decisive": value(percent(sum(bool(m.get("trace_start")) for m in mentions), n),
                                     f"percent of {on} decisive with the cut at the trace's first token", art_locus),
        "attributed_mentions": value(sum(outcome[o] for o in DECIDED), "count of decided mentions attributed "
                                     f"(window {outcome['window']} + at the code {outcome['code']} + censored "
                                     f"{outcome['censored']})", art_locus),
        "probes_total": value(int(sum(b["probes"] for b in bodies)), f"count of forcing probes over {on}", art_locus),
        "median_locus_distance": value(run.median_distance(), f"tokens before the letter, median over "
                                       f"{len(window)} window-decided mentions", art_locus),
        "locus_distance_p10_p90": value([float(x) for x in np.percentile(distances, [10, 90])],
                                        f"tokens, 10th and 90th percentiles over {len(window)} window loci", art_locus),
    }
    firsts = [m["distance"] for m in window if m.get("first_code")]
    v["first_code_median_locus_distance"] = value(float(np.median(firsts)) if firsts else None,
                                                  f"tokens, median over the {len(firsts)} window loci of first codes",
                                                  art_locus)
    v["locus_jump"] = value(float(np.median([m["jump"] for m in window])),
                            "nats, median over window loci of the forced-margin drop across the refined crossing",
                            art_locus)
    v["locus_at_own_description_word"] = value(
        percent(sum(bool(m.get("own_description_word")) for m in window), len(window)),
        "percent of window loci whose token lies in a word (>= 4 letters, structural words removed) of the "
        "emitted code's own description", art_locus)
    shares = [percent(sum(m["outcome"] == "window" for m in b["mentions"]), len(b["mentions"]))
              for b in bodies if b["mentions"]]
    p10, p90 = np.percentile(shares, [10, 90])
    v["per_note_window_share"] = value(float(np.median(shares)), f"percent, median over {len(shares)} notes of "
                                       f"their window-decided share (10th-90th: {p10:.0f}-{p90:.0f})", art_locus)

    sets_path = run.sets_path
    emission_path = instrument_dir(params) / "head_sets_contrast.json"
    locus_sets = load_head_sets(sets_path)
    prose, suffix = run.scores("prose"), run.scores("suffix")
    emission = phase_scores(load_head_sets(emission_path), "P1")
    n_heads = locus_sets["n_heads"]
    top_pool = ranking(prose)[:pool]
    in_band = (top_pool // n_heads >= first) & (top_pool // n_heads <= last)
    art_sets = f"{sets_path}, {emission_path}"
    v[f"prosetime_top{pool}_in_layers_{first}_{last}"] = value(
        int(in_band.sum()), f"count of the prose-time top-{pool} in layers {first}-{last} (0-based; "
        f"{float(prose[top_pool][in_band].sum() / prose[top_pool].sum()):.2f} of their I_c)", sets_path)
    overlap_k = settings.overlap_k
    v["prosetime_emission_overlap_" + "_".join(f"top{k}" for k in overlap_k)] = value(
        [top_k_overlap(prose, emission, k) for k in overlap_k],
        f"counts of heads in both the prose-time and the emission (P1) top-k, k = {list(overlap_k)}", art_sets)
    v["prosetime_emission_ic_spearman"] = value(spearman_over_heads(prose, emission).rho,
                                                f"Spearman over {prose.size} heads of prose-time and emission I_c",
                                                art_sets)
    flat = head_index(leader, locus_sets["n_layers"], n_heads)
    suffix_rank = int(np.flatnonzero(ranking(suffix) == flat)[0]) + 1
    v[f"suffix_ranking_top_ic_{leader}"] = value(float(suffix[flat]), f"nats, suffix (transport) I_c of {leader}, "
                                                 f"rank {suffix_rank} of {suffix.size} (params locus.suffix_leader)",
                                                 sets_path)

    art_abl = f"{out}/*/ablation.json"
    on_notes = (f"median over {sum(bool(a['mentions']) for a in run.ablations)} notes of the mean over their "
                "decided mentions")
    for key, name, what in (
            (f"prosetime_top{small}_window_only_necessity", f"prosetime_top{small}_window", f"prose-time top-{small}, window only"),
            (f"random{small}_window_only_necessity", f"random{small}_window", f"{small} random heads, window only"),
            (f"emission_top{large}_window_only_necessity", f"emission_top{large}_window", f"emission top-{large}, window only"),
            (f"prosetime_top{large}_window_only", f"prosetime_top{large}_window", f"prose-time top-{large}, window only"),
            (f"emission_top{large}_suffix_only", f"emission_top{large}_suffix", f"emission top-{large}, suffix only"),
            (f"prosetime_top{large}_suffix_only", f"prosetime_top{large}_suffix", f"prose-time top-{large}, suffix only"),
            (f"prosetime_top{small}_suffix_only", f"prosetime_top{small}_suffix", f"prose-time top-{small}, suffix only"),
            ("pass_a_own_set_window_only", f"own_top{large}_window", f"each mention's own top-{large}, window only")):
        v[key] = value(run.necessity(name)[0], f"share of the forced margin removed by {what}; {on_notes}", art_abl)
    _, prose_notes = run.necessity(f"prosetime_top{small}_window")
    _, random_notes = run.necessity(f"random{small}_window")
    v["notes_prosetime_above_random"] = value(int(sum(p > r for p, r in zip(prose_notes, random_notes))),
                                              f"count of {len(prose_notes)} notes where the prose-time top-{small} "
                                              f"removes more than {small} random heads, window only", art_abl)
    reads = [x for a in run.ablations for x in a["read"]["prosetime"]]
    randoms = [x for a in run.ablations for x in a["read"]["random"]]
    v["prosetime_note_attention_share"] = value(float(np.mean(reads)), f"attention share on the note at the locus "
                                                f"token, mean over {len(reads)} loci of the prose-time top-{small}",
                                                art_abl)
    v["random_heads_note_share_at_locus"] = value(float(np.mean(randoms)), f"the same for {small} random heads per "
                                                  "note", art_abl)
    inputs = [*run.inputs(), emission_path]
    summary_path = read_dir(settings.out_dir) / READ_SUMMARY
    if summary_path.is_file():   # stage HD-001-locus-read; a locus run without it (R-C15's) has no Table 33
        read = read_json(summary_path, "locus read")
        beats = read["prosetime_region_beats_random"]
        v["notes_prosetime_region_beats_random"] = value(
            beats["notes_higher"], f"count of {beats['notes']} notes whose prose-time top-{read['k']} gives more of its "
            f"attention on the region (the emitted chapter's lines) at the locus than {read['k']} random heads, mean "
            f"over the note's loci (sign test p {beats['p_value']:.3g})", summary_path)
        for group in GROUPS:
            cell = read["groups"][group]
            v[f"table33_{group}"] = value([cell[m] for m in MEASURES], f"mean over {cell['loci']} loci of the group's "
                                          "mean over its heads: [" + ", ".join(MEASURES) + "]", summary_path)
        inputs.append(summary_path)
    return v, inputs


def main() -> int:
    return run_reader("R-C6", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
