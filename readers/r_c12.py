"""R-C12 (Sec. 3.4, App. F, Table 31): does the window's decision carry through to the code letter?

Reads stage HD-001-follow (`mistill locus follow`, `mistill.locus.follow`): per window-decided chapter
mention, the natural margin at the letter with the prose-time top-K mean-ablated over the window (K the
larger of params locus.k, the paper's 16), with K random heads there, with the prose-time heads held
ablated from the window to the letter, and with the emission top-K ablated at the letter only; and the
forced drop of the same window ablation.

* follow-through ratio: median natural drop / median forced drop over the mentions whose forced drop
  exceeds params locus.min_forced_drop (the paper's 1 nat), with both medians;
* the mean natural drop; per note, the mean natural drop of the prose-time set minus that of the random
  set: its mean with a percentile bootstrap interval over notes, the Wilcoxon p and the notes higher;
* the share of natural decisions the window ablation flips; the sustained and at-the-code drops.

And stage HD-001-swap (`mistill locus swap`, `mistill.locus.swap`): per window-decided mention with a
donor of another chapter, the donor's residual leaving each grid layer written at the locus token, the
window's tail or the code token:

* l*, the grid layer with the largest median forced drop under the tail swap; there the median forced
  and natural drops and the donor letter's median natural gain, the transport ratio (median of the
  per-mention natural / forced drop, forced drop above min_forced_drop) and the per-note mean natural
  drop with its bootstrap interval;
* the ratio of the median drops at the first and last grid layer of the prose-time band (locus.layers);
* the flip layer (the code swap hands the natural decision to the donor from there on) and the median
  natural drop of the code swap there and at the next grid layer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.instrument.readout import run_reader, value
from mistill.io import read_json
from mistill.locus import swap as resid
from mistill.locus.follow import flipped, follow_through_ratio, natural_drops
from mistill.locus.passes import LocusSettings, SwapSettings
from mistill.stats import StatsParams, bootstrap_mean, wilcoxon_signed_rank

READER = "readers/r_c12.py"


def keys(params: dict) -> list[str]:
    large = max(LocusSettings.from_params(params).k)
    return ["follow_through_ratio", "natural_margin_drop", "forced_margin_drop", "natural_drop_mean",
            "natural_drop_vs_random_per_note", "natural_drop_vs_random_per_note_interval", "flipped_decisions",
            "sustained_window_to_code_drop", f"emission_top{large}_at_code_drop", *SWAP_KEYS]


SWAP_KEYS = ("analysis_layer_l_star", "transport_ratio", "flip_layer", "tail_swap_forced_natural_donor",
             "tail_swap_per_note_drop", "tail_swap_per_note_drop_interval", "swap_mentions_notes",
             "mid_layer_ratio_l12_l20", "code_swap_target_drop_l24_l28",
             # Figure 5's profile over the grid (registry extra_keys; the grid's length is the profile's)
             "swap_layer_grid", "tail_swap_forced_drop_by_layer", "tail_swap_natural_drop_by_layer",
             "locus_swap_forced_drop_by_layer", "code_swap_natural_drop_by_layer", "code_swap_donor_margin_by_layer")


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    settings = LocusSettings.from_params(params)
    stats = StatsParams.from_params(params)
    out = Path(settings.follow_out_dir)
    paths = sorted(out.glob("*/follow.json"))
    if not paths:
        raise UserError(f"{out}: no follow.json; run `mistill locus follow` (stage HD-001-follow) first")
    notes = [read_json(p, "follow-through") for p in paths]
    rows = [r for n in notes for r in n["mentions"]]
    if not rows:
        raise UserError(f"{out}: no window-decided mention to follow through")
    large, cut = max(settings.k), settings.min_forced_drop
    ratio, natural, forced, kept = follow_through_ratio(rows, cut)
    if not kept:
        raise UserError(f"{out}: no mention's forced drop exceeds {cut} nats; the follow-through ratio is undefined")
    art = f"{out}/*/follow.json"
    on = f"{kept} of {len(rows)} window-decided mentions with forced drop > {cut} nats"
    v = {"follow_through_ratio": value(ratio, f"median natural drop / median forced drop, prose-time top-{large} "
                                       f"over the window; {on}", art),
         "natural_margin_drop": value(natural, f"nats, median natural drop at the letter; {on}", art),
         "forced_margin_drop": value(forced, f"nats, median forced drop at the locus; {on}", art),
         "natural_drop_mean": value(float(natural_drops(rows, "prose").mean()),
                                    f"nats, mean natural drop at the letter over {len(rows)} mentions", art),
         "flipped_decisions": value(100.0 * flipped(rows) / len(rows), f"percent of {len(rows)} mentions whose "
                                    "natural decision the window ablation flips", art),
         "sustained_window_to_code_drop": value(float(np.median(natural_drops(rows, "sustained"))),
                                                f"nats, median natural drop with the prose-time top-{large} held "
                                                f"ablated from the window to the letter, {len(rows)} mentions", art),
         f"emission_top{large}_at_code_drop": value(float(np.median(natural_drops(rows, "emission"))),
                                                    f"nats, median natural drop with the emission top-{large} "
                                                    f"ablated at the letter only, {len(rows)} mentions", art)}
    per_note = [float((natural_drops(n["mentions"], "prose") - natural_drops(n["mentions"], "random")).mean())
                for n in notes if n["mentions"]]
    interval = bootstrap_mean(per_note, n_resamples=stats.bootstrap_resamples, seed=stats.bootstrap_seed,
                              confidence=stats.confidence)
    test = wilcoxon_signed_rank(per_note)
    higher = int(sum(x > 0 for x in per_note))
    v["natural_drop_vs_random_per_note"] = value(
        interval.estimate, f"nats, mean over {len(per_note)} notes of the per-note mean natural drop of the prose-time "
        f"top-{large} minus {large} random heads (Wilcoxon p {test.p_value:.3g}, {higher} notes higher)", art)
    v["natural_drop_vs_random_per_note_interval"] = value(
        [interval.low, interval.high], f"{stats.confidence:.0%} percentile bootstrap over notes", art)
    swap_values, swap_paths = swap_readout(settings, SwapSettings.from_params(params), stats)
    return {**v, **swap_values}, paths + swap_paths


def swap_readout(settings: LocusSettings, swap: SwapSettings, stats: StatsParams) -> tuple[dict, list[Path]]:
    """The residual swap's values (App. F "Swapping the residual stream", Figure 5)."""
    out = Path(swap.out_dir)
    paths = sorted(out.glob("*/swap.json"))
    if not paths:
        raise UserError(f"{out}: no swap.json; run `mistill locus swap` (stage HD-001-swap) first")
    notes = [n for n in (read_json(p, "residual swap") for p in paths) if n["mentions"]]
    if not notes:
        raise UserError(f"{out}: no window-decided mention has a donor of another chapter")
    layers = list(notes[0]["layers"])
    if any(n["layers"] != layers for n in notes):
        raise UserError(f"{out}: notes swapped on different layer grids; rerun `mistill locus swap --force`")
    rows = [r for n in notes for r in n["mentions"]]
    art = f"{out}/*/swap.json"
    l_star = resid.analysis_layer(rows, layers)
    at = layers.index(l_star)
    ratio, kept = resid.transport_ratio(rows, at, settings.min_forced_drop)
    flip = resid.flip_layer(rows, layers)
    if flip is None:
        raise UserError(f"{out}: the code swap never hands the decision to the donor on grid {layers}; "
                        "the flip layer is undefined")
    band = [layer for layer in layers if settings.layers[0] <= layer <= settings.layers[1]]
    if not band:
        raise UserError(f"locus.swap.layers {layers}: no grid layer in the prose-time band {list(settings.layers)}")
    after = layers[min(layers.index(flip) + 1, len(layers) - 1)]
    per_note = [float(resid.drops(n["mentions"], "natural", "tail", at).mean()) for n in notes]
    interval = bootstrap_mean(per_note, n_resamples=stats.bootstrap_resamples, seed=stats.bootstrap_seed,
                              confidence=stats.confidence)
    higher = int(sum(x > 0 for x in per_note))
    on = f"{len(rows)} mentions with a donor of another chapter"
    v = {"analysis_layer_l_star": value(l_star, f"grid layer {layers} with the largest median forced drop under "
                                        f"the tail swap ({swap.tail} positions); {on}", art),
         "transport_ratio": value(ratio, f"median natural / forced drop per mention under the tail swap at "
                                  f"L{l_star}, {kept} mentions with forced drop > {settings.min_forced_drop} nats", art),
         "flip_layer": value(flip, "first grid layer from which on the donor letter's median natural margin under the "
                             f"code-token swap is positive; {on}", art),
         "tail_swap_forced_natural_donor": value(
             [float(np.median(resid.drops(rows, "forced", "tail", at))),
              float(np.median(resid.drops(rows, "natural", "tail", at))),
              float(np.median(resid.donor_gain(rows, "natural", "tail", at)))],
             f"nats at L{l_star}: median forced drop, median natural drop, median donor natural gain; {on}", art),
         "tail_swap_per_note_drop": value(interval.estimate, f"nats, mean over {len(notes)} notes of the per-note mean "
                                          f"natural drop under the tail swap at L{l_star} ({higher} notes above 0)",
                                          art),
         "tail_swap_per_note_drop_interval": value([interval.low, interval.high],
                                                   f"{stats.confidence:.0%} percentile bootstrap over notes", art),
         "swap_mentions_notes": value([len(rows), len(notes)], "mentions swapped, notes", art),
         "mid_layer_ratio_l12_l20": value([resid.ratio_of_medians(rows, layers.index(band[0])),
                                           resid.ratio_of_medians(rows, layers.index(band[-1]))],
                                          f"median natural / median forced drop under the tail swap at L{band[0]} and "
                                          f"L{band[-1]}, the grid's ends in the prose-time band", art),
         "code_swap_target_drop_l24_l28": value(
             [float(np.median(resid.drops(rows, "natural", "code", layers.index(flip)))),
              float(np.median(resid.drops(rows, "natural", "code", layers.index(after))))],
             f"nats, median natural drop under the code-token swap at the flip layer L{flip} and the next grid "
             f"layer L{after}; {on}", art)}

    def by_layer(medians, what: str) -> dict:
        return value([float(np.median(medians(i))) for i in range(len(layers))],
                     f"nats, median {what} per grid layer {layers}; {on}", art)

    v["swap_layer_grid"] = value(layers, "grid layers of the swap", art)
    v["tail_swap_forced_drop_by_layer"] = by_layer(lambda i: resid.drops(rows, "forced", "tail", i),
                                                   "forced drop under the tail swap")
    v["tail_swap_natural_drop_by_layer"] = by_layer(lambda i: resid.drops(rows, "natural", "tail", i),
                                                    "natural drop under the tail swap")
    v["locus_swap_forced_drop_by_layer"] = by_layer(lambda i: resid.drops(rows, "forced", "locus", i),
                                                    "forced drop under the swap of the locus token")
    v["code_swap_natural_drop_by_layer"] = by_layer(lambda i: resid.drops(rows, "natural", "code", i),
                                                    "natural drop under the code-token swap")
    v["code_swap_donor_margin_by_layer"] = by_layer(lambda i: [r["natural"]["code"][i][1] for r in rows],
                                                    "donor letter natural margin under the code-token swap")
    return v, paths


def main() -> int:
    return run_reader("R-C12", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
