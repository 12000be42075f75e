"""R-C7 (Sec. 3.5, App. G, Table 35): the characterization on the shortlist prompts (HD-002) against the full
inventory (HD-001).

Both runs are the same instrument on one new teacher trace per characterization note: TR-006 (full
inventory, HD-001) and TR-007 (its RT-003 shortlist, HD-002).  Per phase: the Spearman of the two
calibrated rankings over every head (mean I_c over notes), the overlap of their top-k at the pool size
(instrument.calibration.pool_k, the paper's top-40) and at the necessity size (readers.necessity_k, its
top-8); HD-002's knock-in of its own global top-k at readers.knockin_k (the paper's top-40) beside the
random-k floor, and its chapter top-k knock-in at the necessity size, with HD-001's value beside it.

The teacher's read side on both runs (HD-001-read, HD-002-read: `mistill instrument readside`, each run's
own App. E panel): the chapter top-k's share on the emitted chapter's lines and its lift at P1, and the
first contrastive reader's share on the near-miss's earlier mentions at P2C (params read_side.panel_k,
readers.named_heads), medians over notes, with the full inventory's value beside each.

The prose locus on both runs (HD-001-locus, HD-002-locus: `mistill locus all`, params locus): HD-002's
median locus distance and its window / inherited / never-decisive shares, the Spearman and top-k overlap
of the two prose-time rankings, and HD-002's window-only ablations of its prose-time top-k, its emission
top-k and each mention's own top-k (params locus.k), with HD-001's value beside each.
"""

from __future__ import annotations

from pathlib import Path

from mistill.instrument.global_sets import phase_scores
from mistill.instrument.read_passes import ReadSide
from mistill.instrument.readout import (
    PHASES,
    instrument_dir,
    load_json,
    reader_settings,
    run_reader,
    value,
)
from mistill.locus.passes import LocusSettings
from mistill.locus.readout import LocusRun
from mistill.stats import spearman_over_heads, top_k_overlap

READER = "readers/r_c7.py"


def shortlist_dir(params: dict) -> Path:
    """The shortlist run: where the distillation's teacher head sets come from (HD-002)."""
    return Path(params["distill"]["teacher_head_sets"]).parent


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params`."""
    pool_k = params["instrument"]["calibration"]["pool_k"]
    settings = reader_settings(params)
    small, knock = settings.necessity_k, settings.knockin_k
    out = []
    for p in (p.lower() for p in PHASES):
        out += [f"ic_spearman_full_vs_shortlist_{p}", f"top{pool_k}_overlap_{p}", f"hd002_knockin_top{knock}_{p}"]
    out += [f"top{small}_overlap_p1_p2_p2c", f"hd002_random{knock}_knockin_p1_p2_p2c",
            f"hd002_chapter_top{small}_knockin"]
    k = ReadSide.from_params(params).panel_k
    out += [f"hd002_chapter_top{k}_region_share", f"hd002_chapter_top{k}_lift"]
    contrastive = settings.named_heads.contrastive_readers
    out += [f"hd002_{contrastive[0]}_near_miss_share"] if contrastive else []
    return out + locus_keys(params)


def locus_keys(params: dict) -> list[str]:
    locus = LocusSettings.from_params(params)
    small, large = min(locus.k), max(locus.k)
    return ["hd002_median_locus_distance", "prosetime_ranking_spearman", f"prosetime_top{locus.pool_k}_overlap",
            f"hd002_own_locus_top{large}_window_only", f"hd002_emission_top{large}_window_only",
            "hd002_window_inherited_never_shares", f"hd002_prosetime_top{small}_window_only"]


def locus_values(params: dict) -> tuple[dict, list[Path]]:
    """The prose-locus keys: HD-002-locus against HD-001-locus."""
    locus = LocusSettings.from_params(params)
    small, large, pool = min(locus.k), max(locus.k), locus.pool_k
    full, short = LocusRun.load(locus.out_dir), LocusRun.load(locus.shortlist_out_dir)
    art = f"{short.out}/*/locus.json"
    abl = f"{short.out}/*/ablation.json, {full.out}/*/ablation.json"
    sets = f"{full.sets_path}, {short.sets_path}"
    on = f"median over {sum(bool(a['mentions']) for a in short.ablations)} notes of the mean over their decided mentions"
    v = {"hd002_median_locus_distance": value(short.median_distance(), f"tokens before the letter, median over "
                                              f"{len(short.window())} window loci, shortlist traces (full inventory "
                                              f"{full.median_distance():.3g})", art),
         "hd002_window_inherited_never_shares": value(
             [short.outcome_share(o) for o in ("window", "inherited", "never")],
             f"shares of {len(short.mentions)} chapter mentions [window, inherited, never decisive], shortlist traces "
             f"(full inventory {', '.join(f'{full.outcome_share(o):.2f}' for o in ('window', 'inherited', 'never'))})",
             art)}
    a, b = full.scores("prose"), short.scores("prose")
    v["prosetime_ranking_spearman"] = value(spearman_over_heads(a, b).rho, f"Spearman over {a.size} heads of the "
                                            "prose-time I_c, full inventory against shortlist", sets)
    v[f"prosetime_top{pool}_overlap"] = value(top_k_overlap(a, b, pool), f"count of {pool} heads in both runs' "
                                              f"prose-time top-{pool}", sets)
    for key, name, what in (
            (f"hd002_own_locus_top{large}_window_only", f"own_top{large}_window", f"each mention's own top-{large}"),
            (f"hd002_emission_top{large}_window_only", f"emission_top{large}_window", f"the emission top-{large}"),
            (f"hd002_prosetime_top{small}_window_only", f"prosetime_top{small}_window", f"the prose-time top-{small}")):
        v[key] = value(short.necessity(name)[0], f"share of the forced margin removed by {what}, window only; {on}, "
                       f"shortlist traces (full inventory {full.necessity(name)[0]:.3g})", abl)
    return v, [*full.inputs(), *short.inputs()]


def read_side_values(params: dict) -> tuple[dict, list[Path]]:
    """The read-side keys: HD-002-read against HD-001-read."""
    from mistill.instrument import read_readout as rr
    from mistill.instrument.readout import head_index

    side = ReadSide.from_params(params)
    k = side.panel_k
    runs = {"full": side.pass_dir("readside"), "shortlist": Path(side.shortlist_out_dir)}
    read = {}
    for name, directory in runs.items():
        read[name] = rr.load_reads(directory)
    v: dict = {}
    art = f"{runs['shortlist']}/*/read.jsonl, {runs['full']}/*/read.jsonl"

    def both(phase: str, heads_of, measure) -> tuple[float | None, float | None]:
        return tuple(rr.median(measure(rows, phase, heads_of(summary))) for summary, rows in
                     (read["shortlist"], read["full"]))

    def chapter_top(summary: dict) -> list[int]:
        return summary["panel"]["top"].get("P1", [])

    share, full = both("P1", chapter_top, lambda rows, phase, heads: rr.group_per_note(rows, phase, heads, rr.REGION))
    if share is not None:
        v[f"hd002_chapter_top{k}_region_share"] = value(
            share, f"median over notes of the chapter top-{k}'s share on the emitted chapter's lines, P1, shortlist "
            f"traces (full inventory {full:.3g})", art)
    lift, full = both("P1", chapter_top, rr.group_lift_per_note)
    if lift is not None:
        v[f"hd002_chapter_top{k}_lift"] = value(lift, f"median over notes of the chapter top-{k}'s region lift, P1, "
                                                f"shortlist traces (full inventory {full:.3g})", art)
    contrastive = reader_settings(params).named_heads.contrastive_readers
    if contrastive:
        summary = read["shortlist"][0]
        head = head_index(contrastive[0], summary["n_layers"], summary["n_heads"])
        n_share, full = both("P2C", lambda _: head,
                             lambda rows, phase, h: rr.share_per_note(rows, phase, h, rr.NEAR_MISS))
        if n_share is not None:
            v[f"hd002_{contrastive[0]}_near_miss_share"] = value(
                n_share, f"median over notes of {contrastive[0]}'s share on the near-miss's earlier mentions, P2C, "
                f"shortlist traces (full inventory {full:.3g})", art)
    inputs = [d / "read_panel.json" for d in runs.values()]
    return v, inputs


def _knockin(faith: dict, phase: str, k: int, kind: str) -> float | None:
    cell = faith["phases"].get(phase, {}).get("bins", {}).get(str(k), {})
    return cell.get("knockin", {}).get(kind, {}).get("median")


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    full_dir, short_dir = instrument_dir(params), shortlist_dir(params)
    full, short = load_json(full_dir / "head_sets_contrast.json"), load_json(short_dir / "head_sets_contrast.json")
    faith_full, faith_short = load_json(full_dir / "faithfulness2.json"), load_json(short_dir / "faithfulness2.json")
    pool_k = params["instrument"]["calibration"]["pool_k"]
    settings = reader_settings(params)
    small, knock = settings.necessity_k, settings.knockin_k
    sets_art = f"{full_dir}/head_sets_contrast.json, {short_dir}/head_sets_contrast.json"
    v: dict = {}
    small_overlaps = []
    for phase in PHASES:
        a, b = phase_scores(full, phase), phase_scores(short, phase)
        rho = spearman_over_heads(a, b)
        p = phase.lower()
        v[f"ic_spearman_full_vs_shortlist_{p}"] = value(rho.rho, f"Spearman over {a.size} heads of mean I_c, full "
                                                        f"inventory against shortlist, {phase}", sets_art)
        v[f"top{pool_k}_overlap_{p}"] = value(top_k_overlap(a, b, pool_k), f"count of {pool_k} heads in both runs' "
                                              f"top-{pool_k}, {phase}", sets_art)
        small_overlaps.append(top_k_overlap(a, b, small))
        median = _knockin(faith_short, phase, knock, "top")
        if median is not None:
            v[f"hd002_knockin_top{knock}_{p}"] = value(median, f"median over notes of knock-in recovery of the global "
                                                       f"top-{knock}, shortlist traces, {phase}",
                                                       short_dir / "faithfulness2.json")
    v[f"top{small}_overlap_p1_p2_p2c"] = value(small_overlaps, f"counts of {small} heads in both runs' top-{small}, "
                                               "[P1, P2, P2C]", sets_art)
    randoms = [_knockin(faith_short, phase, knock, "random") for phase in PHASES]
    if all(r is not None for r in randoms):
        v[f"hd002_random{knock}_knockin_p1_p2_p2c"] = value(randoms, f"medians over notes of knock-in recovery of "
                                                            f"random-{knock} sets, shortlist traces, [P1, P2, P2C]",
                                                            short_dir / "faithfulness2.json")
    chapter, chapter_full = _knockin(faith_short, "P1", small, "top"), _knockin(faith_full, "P1", small, "top")
    if chapter is not None and chapter_full is not None:
        v[f"hd002_chapter_top{small}_knockin"] = value(chapter, f"median over notes of the chapter top-{small} "
                                                       f"knock-in, shortlist traces (full inventory {chapter_full:.3g})",
                                                       f"{short_dir}/faithfulness2.json, {full_dir}/faithfulness2.json")
    inputs = [full_dir / "head_sets_contrast.json", short_dir / "head_sets_contrast.json",
              full_dir / "faithfulness2.json", short_dir / "faithfulness2.json"]
    if (Path(ReadSide.from_params(params).shortlist_out_dir) / "read_panel.json").is_file():
        reads, read_inputs = read_side_values(params)
        v.update(reads)
        inputs += read_inputs
    locus = LocusSettings.from_params(params)
    if (Path(locus.shortlist_out_dir) / "head_sets_locus.json").is_file():
        loci, locus_inputs = locus_values(params)
        v.update(loci)
        inputs += locus_inputs
    return v, inputs


def main() -> int:
    return run_reader("R-C7", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
