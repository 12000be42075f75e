"""R-D30 (Secs. 4.3, 4.4, App. I.4, Tables 2, 3, 45): three seeds at the λ selected for fp32.

Mistill with fp32 master weights at the fp32 grid's pick (recipe variants `fp32pick`, `fp32pick1`, `fp32pick2`;
R-D22 reads seed 0 as the selection record) against fp32 Vanilla CoT-KD, seed i against seed i:

* own-heads P2C recovery of each run's own top-k (the largest and smallest k of evaluate.own_heads.bins, the
  paper's 40 and 8): the seed pairs averaged within each test note, note-clustered, with each pair's mean and
  interval, the notes higher, and the per-seed medians (Table 45's cells);
* the M2 region lift of the own top read-side heads at P2C, note-clustered the same way;
* the task: corpus micro-F1 over the three seed pairs (notes resampled, `seed_matched_corpus_bootstrap_difference`),
  the three-seed means, and the per-note F1 difference with the seeds averaged per note;
* the trace edits (App. E, `mistill.evaluate.edit_effects`): the per-note mean effect of the replacements on the
  events every run of both arms carries, note-clustered;
* the students' own completed generations (App. L.4, stage OWN-variant beside R-D29's OWN-vanilla): each seed
  pair read on the notes both of its own-trace runs carry, the available pair differences averaged per note
  (`mistill.evaluate.available_pairs`), and each run's own-trace mean beside its teacher-forced mean on the same
  notes.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from mistill.errors import UserError
from mistill.evaluate.available_pairs import available_pair_comparison
from mistill.evaluate.compare import arm_values, clustered, seed_dirs, seed_medians
from mistill.evaluate.edit_effects import load_rows, per_note_effect, shared_events
from mistill.evaluate.matched import Family
from mistill.evaluate.own_heads import edits_dir
from mistill.evaluate.own_trace_readout import OwnTraceArm
from mistill.evaluate.own_traces import own_trace_root
from mistill.evaluate.readout import (
    arm_labels,
    load_arms,
    main_for,
    minus_reference,
    note_counts,
    test_notes,
    value,
    where,
)
from mistill.stats import StatsParams, seed_matched_corpus_bootstrap_difference

READER = "readers/r_d30.py"


def keys(params: dict) -> list[str]:
    return ["own_p2c_k40_mistill_minus_fp32_vanilla", "own_p2c_k40_pair_diffs", "mean_of_seed_medians_mistill_vs_vanilla",
            "corpus_microf1_diff", "own_p2c_k8_diff", "m2_lift_diff", "prefix_edit_diff", "own_p2c_k40_higher_notes",
            "own_p2c_k40_pair_intervals", "mistill_fp32_l001_seed_medians", "three_seed_microf1_mistill_vs_vanilla",
            "per_note_microf1_diff",
            # registry extra_keys
            "owntrace_k40_diff", "owntrace_k8_diff", "owntrace_seed_values_vs_tf",
            # registry extra_keys
            "own_p2c_k40_mistill_minus_fp32_vanilla_interval", "corpus_microf1_diff_interval", "own_p2c_k8_diff_interval",
            "m2_lift_diff_interval", "prefix_edit_diff_interval", "per_note_microf1_diff_interval", "fp32_lambda",
            "owntrace_k40_diff_interval", "owntrace_coverage_seeds"]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    fp32 = Family("fp32", params)
    seeds = fp32.seeds
    first = fp32.runs[seeds[0]]
    k, k8 = first.k, first.k_small
    stats = StatsParams.from_params(params)
    notes, arms = test_notes(params), load_arms(params)
    root, label = Path(params["paths"]["artifacts"]), arm_labels(params)["qwen_vanilla_fp32"]
    missing = [s for s in seeds if s not in arms["qwen_vanilla_fp32"]]
    if missing:
        raise UserError(f"{root}/DT-eval/{label}-s{missing[0]}: not evaluated; R-D30 pairs seed i with seed i")
    vanilla = {s: arms["qwen_vanilla_fp32"][s] for s in seeds}
    who = f"fp32 Mistill at the fp32 pick (lambda {fp32.lam:g}) minus fp32 Vanilla CoT-KD, seed pairs {seeds}"
    art = f"{fp32.where()} vs {root}/M6/{label}-s*"
    inputs: list[Path] = [Path(params["evaluate"]["test_notes"]), *seed_dirs(root, label).values()]
    v: dict[str, dict] = {"fp32_lambda": value(fp32.lam, "lambda_P1 = lambda_P2 of the fp32 runs: the fp32 grid's pick",
                                               fp32.pick_file)}

    def reference(readout: str, kk: int | None = None) -> dict[int, dict[str, float]]:
        values = arm_values(root, label, readout, phase="P2C", k=kk, min_range=first.cfg.min_range)
        absent = [s for s in seeds if s not in values]
        if absent:
            raise UserError(f"{root}/M6/{label}-s{absent[0]}: not read; run its own-heads chain")
        return {s: values[s] for s in seeds}

    def paired(key: str, arm: dict, ref: dict, what: str) -> dict:
        c = clustered(arm, ref, stats)
        if c is None:
            raise UserError(f"{art}: no test note carries {what} in every run")
        v[key] = value(c["mean_difference"], f"mean over notes of the per-note difference, {who}, {what}, seed pairs "
                       f"averaged within each note; {c['notes_higher']} higher / {c['notes_lower']} lower of "
                       f"{c['n_notes']}, sign p {c['sign_p']:.3g}, Wilcoxon p {c['wilcoxon_p']:.3g}", art)
        v[f"{key}_interval"] = value([c["ci_low"], c["ci_high"]], f"{c['confidence']:.0%} note-bootstrap interval of "
                                     f"that mean difference", art)
        return c

    # -- own heads ---------------------------------------------------------------------------------------
    own, ref = fp32.recovery("P2C", k), reference("m4", k)
    c = paired("own_p2c_k40_mistill_minus_fp32_vanilla", own, ref, f"own top-{k} P2C recovery")
    v["own_p2c_k40_higher_notes"] = value(c["notes_higher"], f"test notes on which the seed-averaged own top-{k} P2C "
                                          f"recovery difference is positive, {who}, of {c['n_notes']}", art)
    pairs = {s: clustered({s: own[s]}, {s: ref[s]}, stats) for s in seeds}
    v["own_p2c_k40_pair_diffs"] = value([pairs[s]["mean_difference"] for s in seeds], f"per seed pair, the mean over "
                                        f"notes of the own top-{k} P2C recovery difference, {who}", art)
    v["own_p2c_k40_pair_intervals"] = value([[pairs[s]["ci_low"], pairs[s]["ci_high"]] for s in seeds],
                                            f"per seed pair, the {stats.confidence:.0%} note-bootstrap interval of "
                                            "that mean", art)
    mine, theirs = seed_medians(own), seed_medians(ref)
    v["mistill_fp32_l001_seed_medians"] = value([mine["per_seed_median"][s] for s in seeds], f"median over test notes "
                                                f"of the own top-{k} P2C recovery per seed, fp32 Mistill at the fp32 "
                                                f"pick", fp32.where())
    v["mean_of_seed_medians_mistill_vs_vanilla"] = value(
        [mine["mean_of_seed_medians"], theirs["mean_of_seed_medians"]], f"mean over seeds {seeds} of the per-seed "
        f"median own top-{k} P2C recovery: fp32 Mistill at the fp32 pick, fp32 Vanilla CoT-KD", art)
    paired("own_p2c_k8_diff", fp32.recovery("P2C", k8), reference("m4", k8), f"own top-{k8} P2C recovery")
    paired("m2_lift_diff", fp32.lift("P2C"), reference("m2"), "M2 region lift at P2C")

    # -- the task ----------------------------------------------------------------------------------------
    runs = fp32.evaluations()
    corpus = seed_matched_corpus_bootstrap_difference(
        [(note_counts(runs[s], notes), note_counts(vanilla[s], notes)) for s in seeds],
        n_resamples=stats.corpus_bootstrap_resamples, seed=stats.corpus_bootstrap_seed, confidence=stats.confidence)
    task_art = f"{where(runs)} vs {where(vanilla)}"
    v["corpus_microf1_diff"] = value(corpus.estimate, f"{corpus.statistic}; {who}, {corpus.n} test notes", task_art)
    v["corpus_microf1_diff_interval"] = value([corpus.low, corpus.high], f"{corpus.confidence:.0%} interval of the "
                                              f"{corpus.statistic}", task_art)
    v["three_seed_microf1_mistill_vs_vanilla"] = value(
        [statistics.fmean(float(r.task["micro_f1"]) for r in group.values()) for group in (runs, vanilla)],
        f"corpus micro-F1 on the test notes, mean over seeds {seeds}: fp32 Mistill at the fp32 pick, fp32 Vanilla "
        f"CoT-KD", task_art)
    v.update(minus_reference("per_note_microf1_diff", runs, vanilla, notes, stats, who))

    # -- the trace edits ---------------------------------------------------------------------------------
    mine_edits = {s: load_rows(fp32.runs[s].edits_dir("variant")) for s in seeds}
    ref_edits = {s: load_rows(edits_dir(root, label, s)) for s in seeds}
    inputs += [*(fp32.runs[s].edits_dir("variant") for s in seeds), *(edits_dir(root, label, s) for s in seeds)]
    shared = shared_events([*mine_edits.values(), *ref_edits.values()])
    paired("prefix_edit_diff", {s: per_note_effect(r, shared) for s, r in mine_edits.items()},
           {s: per_note_effect(r, shared) for s, r in ref_edits.items()},
           "nats of the mean trace-edit effect on the events every run carries")
    # -- the own completed generations (App. L.4) --------------------------------------------------------
    variants_dir = Path(params["variants"]["dir"])
    own = {s: OwnTraceArm(fp32.runs[s].arms["variant"][1], variants_dir, own_trace_root(variants_dir),
                          first.cfg.min_range) for s in seeds}
    ref_own = OwnTraceArm(label, root, own_trace_root(root), first.cfg.min_range)
    missing = [s for s in seeds if s not in own[s].seeds or s not in ref_own.seeds]
    if missing:
        raise UserError(f"{own_trace_root(variants_dir)}/M6, {own_trace_root(root)}/M6: seed {missing[0]} has no "
                        "own-trace readout; run the OWN-variant and OWN-vanilla stages")
    own_art = f"{own_trace_root(variants_dir)}/M6 vs {ref_own.where()}"
    for kk, key in ((k, "owntrace_k40_diff"), (k8, "owntrace_k8_diff")):
        c = available_pair_comparison({s: own[s].values(kk)[s] for s in seeds},
                                      {s: ref_own.values(kk)[s] for s in seeds}, stats)
        if c is None:
            raise UserError(f"{own_art}: no seed pair shares an own-trace note at k {kk}")
        pairs = ", ".join(str(p["n_notes"]) for p in c["seed_pairs"])
        v[key] = value(c["mean_difference"], f"{who}, own top-{kk} P2C recovery on own traces: mean over the "
                       f"{c['n_notes']} notes with at least one pair of the per-note mean of the available pair "
                       f"differences; common notes per pair {pairs}", own_art)
        if kk == k:
            v[f"{key}_interval"] = value([c["ci_low"], c["ci_high"]], f"{c['confidence']:.0%} note-bootstrap interval "
                                         "of that mean", own_art)
    changes = {s: own[s].change(s, k) for s in seeds}
    if any(c is None for c in changes.values()):
        raise UserError(f"{own_trace_root(variants_dir)}/M6: a seed has no note with both an own-trace and a "
                        "teacher-forced value")
    v["owntrace_seed_values_vs_tf"] = value([changes[s].own for s in seeds] + [changes[s].forced for s in seeds],
                                            f"mean over notes of the own top-{k} P2C recovery on own traces, seeds "
                                            f"{seeds}, then teacher-forced on the same notes, fp32 Mistill at the fp32 "
                                            "pick", own_art)
    v["owntrace_coverage_seeds"] = value([changes[s].n for s in seeds], "test notes with both an own-trace and a "
                                         f"teacher-forced value, per seed {seeds}", own_art)
    inputs += [p for arm in (*own.values(), ref_own) for p in arm.inputs()]
    inputs += [*fp32.inputs, *(p for r in runs.values() for p in r.files()),
               *(p for r in vanilla.values() for p in r.files())]
    return v, sorted(set(inputs))


def main() -> int:
    return main_for("R-D30", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
