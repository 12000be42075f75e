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

The residual swap of App. F (l*, transport ratio, flip layer, tail and code swaps) is not a stage yet
(registry R-C12, unproduced_keys).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.instrument.readout import run_reader, value
from mistill.io import read_json
from mistill.locus.follow import flipped, follow_through_ratio, natural_drops
from mistill.locus.passes import LocusSettings
from mistill.stats import StatsParams, bootstrap_mean, wilcoxon_signed_rank

READER = "readers/r_c12.py"


def keys(params: dict) -> list[str]:
    large = max(LocusSettings.from_params(params).k)
    return ["follow_through_ratio", "natural_margin_drop", "forced_margin_drop", "natural_drop_mean",
            "natural_drop_vs_random_per_note", "natural_drop_vs_random_per_note_interval", "flipped_decisions", "sustained_window_to_code_drop",
            f"emission_top{large}_at_code_drop"]


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
    return v, paths


def main() -> int:
    return run_reader("R-C12", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
