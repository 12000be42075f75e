"""R-D27 (Secs. 4.3-4.4, Tables 2 and 3, App. L): the third SmolLM3 Mistill seed against the untrained student.

Own-heads knock-in recovery at P2C of the SmolLM3 student's own top-k (the largest of evaluate.own_heads.bins, the
paper's 40), from the own-heads chains of Mistill at the profile's first three training seeds and of the untrained
student: the third seed's median over test notes; the three-seed mean (each note's recovery averaged over the
seeds, then over notes, with its bootstrap interval over notes) against the untrained mean; and the mean of the
per-seed medians (Table 3's cell) against the untrained median.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.evaluate.compare import arm_values, seed_dirs, seed_medians
from mistill.evaluate.own_heads import OwnHeadsConfig
from mistill.evaluate.readout import arm_labels, main_for, training_seeds, value
from mistill.stats import StatsParams, bootstrap_mean

READER = "readers/r_d27.py"


def keys(params: dict) -> list[str]:
    return ["smollm_mistill_s2_own_p2c_k40", "smollm_mistill_three_seed_mean", "ratio_to_untrained_mean",
            "untrained_mean_over_notes", "mean_of_per_seed_medians", "untrained_median", "ratio_to_untrained_median",
            # registry extra_keys
            "smollm_mistill_three_seed_mean_interval"]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    cfg, stats, labels = OwnHeadsConfig.from_params(params), StatsParams.from_params(params), arm_labels(params)
    root, k = Path(cfg.artifacts), max(cfg.bins)
    seeds = training_seeds(params)[:3]
    if len(seeds) < 3:
        raise UserError(f"params distill.seeds {training_seeds(params)}: the third seed's readout needs three")
    mistill = arm_values(root, labels["smollm_mistill"], "m4", phase="P2C", k=k, min_range=cfg.min_range)
    untrained = arm_values(root, labels["smollm_untrained"], "m4", phase="P2C", k=k, min_range=cfg.min_range)
    missing = [s for s in seeds if not mistill.get(s)]
    if missing or not untrained:
        raise UserError(f"{root}/M6: SmolLM3 Mistill seed {missing[0] if missing else ''} or the untrained student "
                        "not read; run their own-heads chains")
    mistill_dirs, untrained_dirs = seed_dirs(root, labels["smollm_mistill"]), seed_dirs(root, labels["smollm_untrained"])
    untrained_seed = min(untrained)
    where = ", ".join(str(mistill_dirs[s]) for s in seeds)
    what = f"per-note mean recovery (own top-{k}, P2C, 1-nat gate)"

    notes = sorted(set.intersection(*(set(mistill[s]) for s in seeds)))
    three_seed = bootstrap_mean([float(np.mean([mistill[s][n] for s in seeds])) for n in notes],
                                n_resamples=stats.bootstrap_resamples, seed=stats.bootstrap_seed,
                                confidence=stats.confidence)
    medians = seed_medians({s: mistill[s] for s in seeds})["per_seed_median"]
    untrained_notes = untrained[untrained_seed]
    untrained_mean = float(np.mean(list(untrained_notes.values())))
    untrained_median = float(np.median(list(untrained_notes.values())))
    mean_of_medians = float(np.mean([medians[s] for s in seeds]))
    u_where = str(untrained_dirs[untrained_seed])
    v = {"smollm_mistill_s2_own_p2c_k40": value(medians[seeds[2]], f"median over test notes of {what}, Mistill seed "
                                                f"{seeds[2]}", mistill_dirs[seeds[2]]),
         "smollm_mistill_three_seed_mean": value(three_seed.estimate, f"mean over {len(notes)} test notes of the "
                                                 f"{what} averaged over seeds {'/'.join(map(str, seeds))}", where),
         "smollm_mistill_three_seed_mean_interval": value(
             [three_seed.low, three_seed.high], f"{three_seed.confidence:.0%} percentile bootstrap interval over notes "
             f"of that mean ({three_seed.n_resamples} resamples, seed {three_seed.seed})", where),
         "untrained_mean_over_notes": value(untrained_mean, f"mean over test notes of {what}, the untrained student",
                                            u_where),
         "ratio_to_untrained_mean": value(three_seed.estimate / untrained_mean, "ratio of the three-seed mean to the "
                                          "untrained student's mean", f"{where}, {u_where}"),
         "mean_of_per_seed_medians": value(mean_of_medians, f"mean over seeds {'/'.join(map(str, seeds))} of the "
                                           f"medians over test notes of {what}", where),
         "untrained_median": value(untrained_median, f"median over test notes of {what}, the untrained student",
                                   u_where),
         "ratio_to_untrained_median": value(mean_of_medians / untrained_median, "ratio of the mean of seed medians to "
                                            "the untrained student's median", f"{where}, {u_where}")}
    return v, sorted({*mistill_dirs.values(), *untrained_dirs.values()})


def main() -> int:
    return main_for("R-D27", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
