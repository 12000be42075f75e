"""R-D18 (Sec. 4.2, App. K "Statistics", App. L, Table 43): the task difference at corpus level and the
mechanism gains with the note as the unit.

* Task: Mistill minus Vanilla CoT-KD (bf16, and fp32 master weights) on corpus micro-F1, notes resampled
  (`mistill.stats.seed_matched_corpus_bootstrap_difference`: params stats.corpus_bootstrap_resamples,
  seed stats.corpus_bootstrap_seed; seed i against seed i, the mean over the seed pairs).  Each run's
  pooled micro-F1 is first reproduced from its generations (`readout.note_counts`).  Beside it, the
  per-note estimand of Table 2 (mean per-note F1 difference, seeds averaged per note, percentile
  bootstrap), and the largest distance between the two intervals' ends over the pairs read: the
  paper's check that the two estimands give the same verdict (App. K, "within 0.012").
* Mechanism: own-heads P2C recovery (top-k of each arm's re-ranked heads), Mistill minus bf16 Vanilla
  CoT-KD, seed-matched and note-clustered (`evaluate.compare.clustered`, the R-D6 test): the mean over
  notes of each note's mean seed-pair difference, its bootstrap interval, notes higher, sign-test p.

Reads `<artifacts>/DT-eval/<label>-s<seed>/` (task.json, generations.jsonl) and the own-heads chain's
`M6/<label>-s<seed>/` cells; arm labels from params evaluate.own_heads.arms.
"""

from __future__ import annotations

from pathlib import Path

from mistill.evaluate.compare import arm_values, clustered, seed_dirs
from mistill.evaluate.own_heads import OwnHeadsConfig
from mistill.evaluate.readout import (
    eval_root,
    load_arms,
    main_for,
    note_counts,
    per_note_mean_over_seeds,
    seeds_text,
    test_notes,
    value,
    where,
)
from mistill.stats import StatsParams, paired_comparison, seed_matched_corpus_bootstrap_difference
from mistill.stats.clustered import matched_seed_pairs

READER = "readers/r_d18.py"
FAMILIES = ("qwen", "smollm")
REFERENCES = ("bf16", "fp32")
HEADLINE = ("qwen", "bf16")  # the pair whose corpus difference the paper names without a family prefix


def corpus_key(family: str, tag: str) -> str:
    if (family, tag) == HEADLINE:
        return "corpus_microf1_mistill_minus_bf16_vanilla"
    return f"{family}_corpus_microf1_mistill_minus_{tag}_vanilla"


def per_note_key(family: str, tag: str) -> str:
    return f"{family}_per_note_microf1_mistill_minus_{tag}_vanilla"


def clustered_key(family: str) -> str:
    return f"{family}_note_clustered_p2c_gain_vs_bf16"


def _pairs(labels) -> list[tuple[str, str]]:
    return [(f, t) for f in FAMILIES for t in REFERENCES if {f"{f}_mistill", f"{f}_vanilla_{t}"} <= set(labels)]


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params` (the arm rows evaluate.own_heads.arms names)."""
    labels = (params["evaluate"]["own_heads"].get("arms") or {})
    pairs = _pairs(labels)
    out = []
    for family, tag in pairs:
        out += [corpus_key(family, tag), f"{corpus_key(family, tag)}_interval",
                per_note_key(family, tag), f"{per_note_key(family, tag)}_interval"]
    for family in FAMILIES:
        if (family, "bf16") in pairs:
            k = clustered_key(family)
            out += [k, f"{k}_interval", f"{family}_note_clustered_p2c_higher_notes", f"{family}_note_clustered_p2c_sign_p"]
    return out + (["corpus_vs_per_note_interval_endpoint_gap_max"] if pairs else [])


def _task_values(params: dict, stats: StatsParams, v: dict) -> list[Path]:
    arms = load_arms(params)
    notes = test_notes(params)
    inputs: list[Path] = []
    gaps = []
    for family, tag in _pairs(arms):
        arm, ref = arms[f"{family}_mistill"], arms[f"{family}_vanilla_{tag}"]
        inputs += [p for seeds in (arm, ref) for run in seeds.values() for p in run.files()]
        art = f"{where(arm)} vs {where(ref)}"
        who = f"Mistill ({seeds_text(arm)}) minus {tag} Vanilla CoT-KD ({seeds_text(ref)})"
        corpus = seed_matched_corpus_bootstrap_difference(
            [(note_counts(arm[a], notes), note_counts(ref[r], notes)) for a, r in matched_seed_pairs(arm, ref)],
            n_resamples=stats.corpus_bootstrap_resamples, seed=stats.corpus_bootstrap_seed,
            confidence=stats.confidence)
        key = corpus_key(family, tag)
        v[key] = value(corpus.estimate, f"{corpus.statistic}; {who}, {corpus.n} test notes", art)
        v[f"{key}_interval"] = value([corpus.low, corpus.high], f"{corpus.confidence:.0%} interval of the "
                                     f"{corpus.statistic}; {who}", art)
        per_note = paired_comparison(per_note_mean_over_seeds(arm, notes), per_note_mean_over_seeds(ref, notes),
                                     n_resamples=stats.bootstrap_resamples, seed=stats.bootstrap_seed,
                                     confidence=stats.confidence).mean_difference
        key = per_note_key(family, tag)
        v[key] = value(per_note.estimate, f"mean over {per_note.n} test notes of the per-note F1 difference "
                       f"(seeds averaged per note); {who}", art)
        v[f"{key}_interval"] = value([per_note.low, per_note.high], f"{per_note.confidence:.0%} percentile bootstrap "
                                     f"interval of the mean per-note F1 difference ({per_note.n_resamples} resamples, "
                                     f"seed {per_note.seed}); {who}", art)
        gaps.append(max(abs(corpus.low - per_note.low), abs(corpus.high - per_note.high)))
    if gaps:
        v["corpus_vs_per_note_interval_endpoint_gap_max"] = value(
            max(gaps), f"max abs difference of the corpus-level and the per-note micro-F1 interval ends "
            f"over {len(gaps)} pairs of Mistill minus Vanilla CoT-KD", f"{eval_root(params)}/*")
    return inputs


def _mechanism_values(params: dict, stats: StatsParams, v: dict) -> list[Path]:
    cfg = OwnHeadsConfig.from_params(params)
    labels = dict(params["evaluate"]["own_heads"].get("arms") or {})
    root, k = Path(cfg.artifacts), max(cfg.bins)
    inputs: list[Path] = []
    for family in FAMILIES:
        if (family, "bf16") not in _pairs(labels):
            continue
        arm, ref = labels[f"{family}_mistill"], labels[f"{family}_vanilla_bf16"]
        inputs += [*seed_dirs(root, arm).values(), *seed_dirs(root, ref).values()]
        c = clustered(*(arm_values(root, label, "m4", phase="P2C", k=k, set_kind="top", min_range=cfg.min_range)
                        for label in (arm, ref)), stats)
        if c is None:
            continue
        art = f"{root}/M6/{arm}-s* vs {root}/M6/{ref}-s*"
        what = f"own top-{k} P2C knock-in recovery, Mistill minus bf16 Vanilla CoT-KD, seed-matched"
        key = clustered_key(family)
        v[key] = value(c["mean_difference"], f"note-clustered mean over {c['n_notes']} test notes of the per-note "
                       f"mean seed-pair difference; {what}", art)
        v[f"{key}_interval"] = value([c["ci_low"], c["ci_high"]], f"{c['confidence']:.0%} percentile bootstrap "
                                     f"interval over notes ({stats.bootstrap_resamples} resamples, seed "
                                     f"{stats.bootstrap_seed}) of the note-clustered mean; {what}", art)
        v[f"{family}_note_clustered_p2c_higher_notes"] = value(
            c["notes_higher"], f"count of {c['n_notes']} test notes where Mistill is higher ({c['notes_lower']} lower)",
            art)
        v[f"{family}_note_clustered_p2c_sign_p"] = value(
            c["sign_p"], f"two-sided sign test over notes, note-clustered (Wilcoxon p {c['wilcoxon_p']:.3g})", art)
    return inputs


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    stats = StatsParams.from_params(params)
    v: dict = {}
    inputs = _task_values(params, stats, v) + _mechanism_values(params, stats, v)
    return v, [*inputs, Path(params["evaluate"]["test_notes"])]


if __name__ == "__main__":
    raise SystemExit(main_for("R-D18", READER, compute_values, keys))
