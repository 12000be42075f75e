"""R-C5 (Sec. 3.3, App. E, Tables 16-19): what the chapter, character and contrastive heads read.

From HD-001-read (`mistill instrument readside`: the App. E panel's attention at every decision event,
split over the 15 key categories, with each head's importance there) and HD-001's global sets.
Values are medians over notes of per-note means (`mistill.instrument.read_readout`); the heads
reported by name are params `readers.named_heads`: the region readers (the paper's L26H36, L28H21,
L26H37, L26H18), the prose readers (L39H38 ...) and the contrastive readers (L30H11, L38H39).

* region readers at P1: share on the emitted chapter's lines, lift, r with importance across events;
* prose readers at P1: share on the trace prose (the first one's, and the range over all of them);
* the first contrastive reader at P2C: share on the near-miss's earlier mentions (N; median, 10th and
  90th percentiles over notes), on the code's own (S), notes above the random panel and with N above
  S, r between its N share and its importance;
* groups: the random panel's region share (P1) and N share (P2C); the contrastive top-k's N and prefix
  shares; the character top-k heads that read the code prefix or the category's lines more than the
  random panel does, as the range of their shares (the paper's "seven heads ... 0.28 to 0.74");
* the chapter top-k's Spearman between region lift and I_c; App. E's query-key score (S minus N, the
  largest panel head's mean) that fails to separate heads; the panel's size;
* Table 16 per phase: the top-k's, random panel's and bottom-k's region lift, notes on which the
  top-k's lift beats the random panel's, and the top-k's and random panel's shares on the sink, the
  inventory's code lines, the note, the trace prose and the code prefix.

Descriptive: attention is not intervened on here (R-C10 does).
"""

from __future__ import annotations

from pathlib import Path

from scipy.stats import spearmanr

from mistill.instrument import read_readout as rr
from mistill.instrument.global_sets import load_head_sets, phase_scores
from mistill.instrument.read_passes import ReadSide
from mistill.instrument.readout import (
    head_index,
    instrument_dir,
    reader_settings,
    run_reader,
    value,
)

READER = "readers/r_c5.py"
TABLE16_SHARES = (("sink", rr.SINK), ("code lines", rr.CODE_LINES), ("note", rr.NOTE), ("trace prose", rr.PROSE),
                  ("code prefix", rr.PREFIX))


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params` (named heads and the panel size from params)."""
    heads = reader_settings(params).named_heads
    k = ReadSide.from_params(params).panel_k
    region, prose, contrastive = heads.region_readers, heads.prose_readers, heads.contrastive_readers
    out = []
    if region:
        out += [f"{region[0]}_region_share", f"{region[0]}_region_lift", f"{region[0]}_region_importance_corr"]
    if len(region) > 1:
        out += [f"{region[1]}_region_share", f"region_importance_r_{'_'.join(region[1:])}"]
    if prose:
        out += [f"{prose[0]}_prose_share", "prose_readers_prose_share"]
    if contrastive:
        c = contrastive[0]
        out += [f"{c}_near_miss_share", f"{c}_near_miss_share_p10_p90", f"{c}_own_code_share",
                f"{c}_notes_above_random", f"{c}_notes_n_above_s", f"{c}_n_share_importance_r"]
    out += ["random_panel_near_miss_share", "random_panel_region_share", "char_heads_prefix_share",
            "char_heads_sibling_share", f"contrastive_top{k}_n_share", f"contrastive_top{k}_prefix_share"]
    for phase in ("p1", "p2", "p2c"):
        out += [f"top{k}_region_lift_{phase}", f"random_panel_region_lift_{phase}",
                f"top{k}_lift_notes_above_random_{phase}", f"top{k}_shares_{phase}", f"random_panel_shares_{phase}"]
        out += [f"bottom{k}_region_lift_{phase}"] if phase != "p2" else []
    out += [f"lift_vs_ic_spearman_chapter_top{k}", "qk_score_max", "read_panel_size"]
    out += [f"{h}_p1_read" for h in dict.fromkeys([*region, *prose])]
    out += [f"{h}_p2c_read" for h in contrastive]
    return out


def _range(values: list[float]) -> list[float] | None:
    return [float(min(values)), float(max(values))] if values else None


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    side = ReadSide.from_params(params)
    read_dir = side.pass_dir("readside")
    summary, rows = rr.load_reads(read_dir)
    L, H = summary["n_layers"], summary["n_heads"]
    panel = summary["panel"]
    k = side.panel_k
    art = f"{read_dir}/*/read.jsonl"
    on = f"{len(rows)} notes"
    named = reader_settings(params).named_heads
    flat = {name: head_index(name, L, H) for name in [*named.region_readers, *named.prose_readers,
                                                       *named.contrastive_readers]}
    random = panel["random"]
    panel_heads = sorted({h for group in ("top", "bottom") for hs in panel[group].values() for h in hs} | set(random))
    v: dict[str, dict] = {}

    def put(key: str, x, statistic: str) -> None:
        if x is not None:
            v[key] = value(x, statistic, art)

    # region readers at P1
    region = named.region_readers
    for i, name in enumerate(region[:2]):
        put(f"{name}_region_share", rr.median(rr.share_per_note(rows, "P1", flat[name], rr.REGION)),
            f"median over {on} of the per-note mean share of attention on the emitted chapter's lines, P1 events")
        if i == 0:
            put(f"{name}_region_lift", rr.median(rr.lift_per_note(rows, "P1", flat[name])),
                f"median over {on} of the per-note mean region lift, P1 events")
            put(f"{name}_region_importance_corr", rr.share_importance_r(rows, "P1", flat[name], rr.REGION),
                "Pearson r across the head's P1 events, region share against importance")
    if len(region) > 1:
        rs = [rr.share_importance_r(rows, "P1", flat[n], rr.REGION) for n in region[1:]]
        if all(r is not None for r in rs):
            put(f"region_importance_r_{'_'.join(region[1:])}", rs,
                f"Pearson r across P1 events, region share against importance, for {', '.join(region[1:])}")
    # prose readers at P1
    prose = named.prose_readers
    if prose:
        shares = [rr.median(rr.share_per_note(rows, "P1", flat[n], rr.PROSE)) for n in prose]
        put(f"{prose[0]}_prose_share", shares[0], f"median over {on} of the per-note mean share on the trace prose, P1")
        put("prose_readers_prose_share", _range([s for s in shares if s is not None]),
            f"range over {', '.join(prose)} of the median share on the trace prose, P1")
    # the contrastive reader at P2C
    random_n = rr.group_per_note(rows, "P2C", random, rr.NEAR_MISS)
    if named.contrastive_readers:
        c = named.contrastive_readers[0]
        n_share = rr.share_per_note(rows, "P2C", flat[c], rr.NEAR_MISS)
        s_share = rr.share_per_note(rows, "P2C", flat[c], rr.OWN_CODE)
        put(f"{c}_near_miss_share", rr.median(n_share),
            f"median over {on} of the per-note mean share on the near-miss's earlier mentions (N), P2C")
        put(f"{c}_near_miss_share_p10_p90", rr.percentiles(n_share, (10, 90)), "10th and 90th percentiles over notes")
        put(f"{c}_own_code_share", rr.median(s_share), "median over notes of the share on the code's earlier "
            "mentions (S), P2C")
        above, n = rr.notes_above(n_share, random_n)
        put(f"{c}_notes_above_random", above, f"count of {n} notes, N share above the random panel's")
        above, n = rr.notes_above(n_share, s_share)
        put(f"{c}_notes_n_above_s", above, f"count of {n} notes, N share above S share")
        put(f"{c}_n_share_importance_r", rr.share_importance_r(rows, "P2C", flat[c], rr.NEAR_MISS),
            "Pearson r across the head's P2C events, N share against importance")
    put("random_panel_near_miss_share", rr.median(random_n),
        f"median over notes of the {len(random)} random heads' mean share on N, P2C")
    put("random_panel_region_share", rr.median(rr.group_per_note(rows, "P1", random, rr.REGION)),
        f"median over notes of the {len(random)} random heads' mean share on the region, P1")
    # the character top-k: prefix readers and category-line readers above the random panel
    for key, cats, what in (("char_heads_prefix_share", rr.PREFIX, "the code prefix"),
                            ("char_heads_sibling_share", rr.SIBLINGS, "the emitted code's category siblings")):
        floor = rr.median(rr.group_per_note(rows, "P2", random, cats))
        shares = [rr.median(rr.share_per_note(rows, "P2", h, cats)) for h in panel["top"].get("P2", [])]
        readers = [s for s in shares if s is not None and floor is not None and s > floor]
        put(key, _range(readers), f"range over the {len(readers)} of the P2 top-{k} heads above the random "
            f"panel ({floor:.3f}) of the median share on {what}, P2" if floor is not None else "")
    for key, cats in ((f"contrastive_top{k}_n_share", rr.NEAR_MISS), (f"contrastive_top{k}_prefix_share", rr.PREFIX)):
        put(key, rr.median(rr.group_per_note(rows, "P2C", panel["top"].get("P2C", []), cats)),
            f"median over notes of the P2C top-{k}'s mean share (random panel: "
            f"{rr.median(rr.group_per_note(rows, 'P2C', random, cats)):.3f})")
    # Table 16: per phase
    shares_order = ", ".join(name for name, _ in TABLE16_SHARES)
    for phase in ("P1", "P2", "P2C"):
        p, top = phase.lower(), panel["top"].get(phase, [])
        top_lift = rr.group_lift_per_note(rows, phase, top)
        random_lift = rr.group_lift_per_note(rows, phase, random)
        put(f"top{k}_region_lift_{p}", rr.median(top_lift), f"median over notes of the {phase} top-{k}'s mean lift")
        put(f"random_panel_region_lift_{p}", rr.median(random_lift), "median over notes of the random panel's lift")
        if phase in panel["bottom"]:
            put(f"bottom{k}_region_lift_{p}", rr.median(rr.group_lift_per_note(rows, phase, panel["bottom"][phase])),
                f"median over notes of the {phase} bottom-{k}'s mean lift")
        above, n = rr.notes_above(top_lift, random_lift)
        put(f"top{k}_lift_notes_above_random_{p}", above, f"count of {n} notes, top-{k} lift above the random panel's")
        for group, heads in ((f"top{k}", top), ("random_panel", random)):
            put(f"{group}_shares_{p}", [rr.median(rr.group_per_note(rows, phase, heads, cats)) or 0.0
                                        for _, cats in TABLE16_SHARES],
                f"medians over notes of the group's share on [{shares_order}], {phase}")
    # the chapter top-k: does a head's region lift follow its importance? (the paper: Spearman 0.00)
    sets = load_head_sets(instrument_dir(params) / "head_sets_contrast.json")
    top_p1 = panel["top"].get("P1", [])
    lifts = [rr.median(rr.lift_per_note(rows, "P1", h)) for h in top_p1]
    if len(top_p1) > 2 and None not in lifts:
        ic = phase_scores(sets, "P1")[top_p1]
        put(f"lift_vs_ic_spearman_chapter_top{k}", float(spearmanr(lifts, ic).statistic),
            f"Spearman over the P1 top-{k} heads of the median region lift against I_c")
    # the query-key score App. E rejects: cos(query, mean key on S) - cos(query, mean key on N), per head
    # the mean over P2C events with both, then the largest over the panel
    scores = [rr.mean_query_key_score(rows, "P2C", h) for h in panel_heads]
    scores = [x for x in scores if x is not None]
    if scores:
        put("qk_score_max", max(scores), f"max over {len(scores)} panel heads of the mean query-key score S minus N, "
            "P2C events with both")
    put("read_panel_size", summary["panel_size"], "heads in the panel (ranked and random groups)")
    # Tables 17 and 19: the named heads, one row each
    for name in dict.fromkeys([*region, *prose]):
        h = flat[name]
        row = [rr.median(rr.share_per_note(rows, "P1", h, cats)) for cats in (rr.REGION, rr.PROSE, rr.SINK)]
        row += [rr.median(rr.lift_per_note(rows, "P1", h)), rr.share_importance_r(rows, "P1", h, rr.REGION)]
        put(f"{name}_p1_read", [x if x is not None else 0.0 for x in row],
            "[region share, prose share, sink share, region lift, r(region share, importance)] at P1; "
            "medians over notes (r across events, 0 where undefined)")
    for name in named.contrastive_readers:
        h = flat[name]
        n_share = rr.share_per_note(rows, "P2C", h, rr.NEAR_MISS)
        s_share = rr.share_per_note(rows, "P2C", h, rr.OWN_CODE)
        above, n = rr.notes_above(n_share, s_share)
        put(f"{name}_p2c_read", [rr.median(n_share) or 0.0, rr.median(s_share) or 0.0, above],
            f"[N share, S share, notes of {n} with N above S] at P2C; medians over notes")
    inputs = [read_dir / "read_panel.json", *(read_dir / n / "read.jsonl" for n in rows)]
    return v, inputs


def main() -> int:
    return run_reader("R-C5", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
