"""R-D32 (Sec. 4.5, App. M.2, Table 52): the task under the matched selection.

The six test evaluations of R-D31 (`mistill.evaluate.matched`): Mistill at its pick minus RandHeads on the frozen
pool at its pick, on corpus micro-F1 over the test notes, seed i against seed i. The corpus-level difference is
the mean over the seed pairs, notes resampled (`mistill.stats.seed_matched_corpus_bootstrap_difference`; params
stats.corpus_bootstrap_resamples, stats.corpus_bootstrap_seed), beside each pair's difference and each family's
mean micro-F1.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from mistill.evaluate.matched import matched_families
from mistill.evaluate.readout import main_for, note_counts, test_notes, value
from mistill.stats import StatsParams, seed_matched_corpus_bootstrap_difference

READER = "readers/r_d32.py"


def keys(params: dict) -> list[str]:
    return ["corpus_microf1_mistill_minus_randheads", "corpus_microf1_pairs", "test_microf1_mistill_pick",
            "test_microf1_randheads_pick",
            # registry extra_keys
            "corpus_microf1_mistill_minus_randheads_interval"]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    mistill, randheads = matched_families(params)
    stats = StatsParams.from_params(params)
    notes = test_notes(params)
    arm, ref = mistill.evaluations(), randheads.evaluations()
    seeds = mistill.seeds
    art = f"{', '.join(str(arm[s].path) for s in seeds)} vs {', '.join(str(ref[s].path) for s in seeds)}"
    who = (f"Mistill at lambda = {mistill.lam:g} minus RandHeads (frozen pool) at lambda = {randheads.lam:g}, "
           f"seed pairs {', '.join(map(str, seeds))}")
    corpus = seed_matched_corpus_bootstrap_difference(
        [(note_counts(arm[s], notes), note_counts(ref[s], notes)) for s in seeds],
        n_resamples=stats.corpus_bootstrap_resamples, seed=stats.corpus_bootstrap_seed, confidence=stats.confidence)
    v = {"corpus_microf1_mistill_minus_randheads": value(corpus.estimate, f"{corpus.statistic}; {who}, {corpus.n} "
                                                         f"test notes", art),
         "corpus_microf1_mistill_minus_randheads_interval": value(
             [corpus.low, corpus.high], f"{corpus.confidence:.0%} interval of the {corpus.statistic}; {who}", art),
         "corpus_microf1_pairs": value([float(arm[s].task["micro_f1"]) - float(ref[s].task["micro_f1"]) for s in seeds],
                                       f"corpus micro-F1 on the test notes, Mistill minus RandHeads, per seed pair; "
                                       f"{who}", art)}
    for family, runs in ((mistill, arm), (randheads, ref)):
        v[f"test_microf1_{family.name}_pick"] = value(
            statistics.fmean(float(runs[s].task["micro_f1"]) for s in seeds),
            f"corpus micro-F1 on the test notes, mean over seeds {', '.join(map(str, seeds))}, {family.name} at its "
            f"pick lambda = {family.lam:g}", ", ".join(str(runs[s].path) for s in seeds))
    inputs = [Path(params["evaluate"]["test_notes"]), *mistill.inputs, *randheads.inputs]
    return v, sorted(set(inputs))


def main() -> int:
    return main_for("R-D32", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
