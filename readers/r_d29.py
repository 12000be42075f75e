"""R-D29 (Sec. 4.4, App. L.4, Table 49): own-heads recovery on each student's own completed generations.

Reads the own-trace chain (`mistill evaluate own-traces`: each arm's completed test generations, its own events
and the knock-in of its own global sets, under <artifacts>/own-trace) beside the teacher-forced own-heads cells
(<artifacts>/M6), through `mistill.evaluate.own_trace_readout`:

* per arm row of params evaluate.own_heads.arms and seed: the mean over notes of the own-trace P2C recovery of
  the own top-k (the largest and smallest k of evaluate.own_heads.bins, the paper's 40 and 8), its random floor,
  the teacher-forced value on the same notes, the coverage (notes with a measurable own-trace recovery) and the
  completed generations (Table 49's rows);
* the paired change own minus teacher-forced on the same notes, per arm and seed;
* Mistill minus Vanilla CoT-KD (bf16 and fp32) on the Qwen student, seed i against seed i, each pair read on the
  notes both of its runs carry and the available pair differences averaged per note
  (`mistill.evaluate.available_pairs`).

The SmolLM3 keys of the paper list two seeds; they read the profile's first two, the third Mistill seed being
R-D36's.
"""

from __future__ import annotations

from pathlib import Path

from mistill.errors import UserError
from mistill.evaluate.available_pairs import available_pair_comparison
from mistill.evaluate.own_heads import OwnHeadsConfig
from mistill.evaluate.own_trace_readout import OwnTraceArm, own_trace_root
from mistill.evaluate.readout import arm_labels, main_for, training_seeds, value
from mistill.stats import StatsParams

READER = "readers/r_d29.py"
CELLS = ("owntrace_p2c_k40", "owntrace_random_p2c_k40", "forced_p2c_k40_same_notes", "owntrace_p2c_k8",
         "forced_p2c_k8_same_notes", "owntrace_coverage", "completed")


def keys(params: dict) -> list[str]:
    rows = list(arm_labels(params))
    return ["mistill_s0_owntrace_p2c_k40", "mistill_minus_bf16_vanilla_owntrace_k40",
            "mistill_minus_bf16_vanilla_owntrace_k8", "mistill_minus_fp32_vanilla_owntrace_k40",
            "mistill_minus_fp32_vanilla_owntrace_k8", "qwen_largest_owntrace_change_k40",
            "untrained_qwen_owntrace_change", "smollm_mistill_owntrace_change", "smollm_fp32_vanilla_owntrace_change",
            "smollm_owntrace_mistill_vs_vanilla", "qwen_owntrace_coverage", "smollm_owntrace_coverage",
            # registry extra_keys
            "mistill_s0_forced_p2c_k40_same_notes", "mistill_minus_bf16_vanilla_owntrace_k40_interval",
            "mistill_minus_bf16_vanilla_owntrace_k40_higher_notes", "mistill_minus_fp32_vanilla_owntrace_k40_interval",
            *(f"{row}_{cell}_seeds" for row in rows for cell in CELLS)]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    cfg = OwnHeadsConfig.from_params(params)
    k, k8 = max(cfg.bins), min(cfg.bins)
    stats = StatsParams.from_params(params)
    artifacts = Path(cfg.artifacts)
    arms = {row: OwnTraceArm(label, artifacts, own_trace_root(artifacts), cfg.min_range)
            for row, label in arm_labels(params).items()}
    first_two = training_seeds(params)[:2]
    v: dict[str, dict] = {}
    inputs: list[Path] = []
    for row, arm in arms.items():
        if not arm.seeds:
            raise UserError(f"{arm.where()}: no own-trace readout of {arm.label}; run its OWN stage")
        inputs += arm.inputs()

    # -- Table 49's rows ------------------------------------------------------------------------------------
    for row, arm in arms.items():
        seeds, own, forced = arm.seeds, arm.where(), arm.where(forced=True)
        changes = {kk: {s: arm.change(s, kk) for s in seeds} for kk in (k, k8)}
        per_seed = f"per seed {seeds}"
        v[f"{row}_owntrace_p2c_k40_seeds"] = value(
            [arm.mean(s, k) for s in seeds], f"mean over notes of the own top-{k} P2C recovery on the arm's own "
            f"completed traces, {per_seed}", own)
        v[f"{row}_owntrace_random_p2c_k40_seeds"] = value(
            [arm.mean(s, k, "random") for s in seeds], f"mean over notes of the P2C recovery of count-matched random "
            f"{k}-head sets on the own traces, {per_seed}", own)
        v[f"{row}_owntrace_p2c_k8_seeds"] = value(
            [arm.mean(s, k8) for s in seeds], f"the same for the own top-{k8}, {per_seed}", own)
        for kk, key in ((k, "forced_p2c_k40_same_notes"), (k8, "forced_p2c_k8_same_notes")):
            v[f"{row}_{key}_seeds"] = value(
                [c.forced if c else None for c in changes[kk].values()], f"mean of the teacher-forced own top-{kk} P2C "
                f"recovery on the notes with an own-trace value, {per_seed}", f"{forced} vs {own}")
        v[f"{row}_owntrace_coverage_seeds"] = value(
            [arm.measurable(s, k) for s in seeds], f"test notes with a measurable own-trace P2C recovery at k {k}, "
            f"{per_seed}", own)
        v[f"{row}_completed_seeds"] = value(
            [arm.completed(s) for s in seeds], f"test generations whose reasoning block closes before the cap, of "
            f"{arm.generated(seeds[0])}, {per_seed}", own)

    def change(row: str, seed: int, kk: int = k):
        c = arms[row].change(seed, kk)
        if c is None:
            raise UserError(f"{arms[row].where()}: seed {seed} has no note with both an own-trace and a teacher-forced "
                            f"value at k {kk}")
        return c

    def change_text(row: str, seed: int, kk: int = k) -> str:
        c = change(row, seed, kk)
        return (f"mean over {c.n} notes of own-trace minus teacher-forced own top-{kk} P2C recovery, "
                f"{arms[row].label} seed {seed}, {c.higher} higher")

    # -- the Qwen student ----------------------------------------------------------------------------------
    mistill, s0 = arms["qwen_mistill"], training_seeds(params)[0]
    c = change("qwen_mistill", s0)
    v["mistill_s0_owntrace_p2c_k40"] = value(c.own, f"mean over the {c.n} notes with both values of the own top-{k} "
                                             f"P2C recovery on the own traces, Mistill seed {s0}", mistill.where())
    v["mistill_s0_forced_p2c_k40_same_notes"] = value(c.forced, f"the teacher-forced value on those {c.n} notes",
                                                      mistill.where(forced=True))
    for tag in ("bf16", "fp32"):
        ref = arms[f"qwen_vanilla_{tag}"]
        art = f"{mistill.where()} vs {ref.where()}"
        for kk, suffix in ((k, "k40"), (k8, "k8")):
            cmp = available_pair_comparison(mistill.values(kk), ref.values(kk), stats)
            if cmp is None:
                raise UserError(f"{art}: no seed pair shares a note with own-trace values at k {kk}")
            key = f"mistill_minus_{tag}_vanilla_owntrace_{suffix}"
            pairs = ", ".join(f"{p['n_notes']}" for p in cmp["seed_pairs"])
            v[key] = value(cmp["mean_difference"], f"Mistill minus {tag} Vanilla CoT-KD, own top-{kk} P2C recovery "
                           f"on own traces: {cmp['statistic']}; common notes per pair {pairs}; "
                           f"{cmp['notes_higher']} higher of {cmp['n_notes']}", art)
            if kk == k:
                v[f"{key}_interval"] = value([cmp["ci_low"], cmp["ci_high"]], f"{cmp['confidence']:.0%} note-bootstrap "
                                             "interval of that mean", art)
                if tag == "bf16":
                    v[f"{key}_higher_notes"] = value(cmp["notes_higher"], f"notes with a positive per-note mean "
                                                     f"difference, of {cmp['n_notes']}", art)
    trained = [(row, s) for row in ("qwen_mistill", "qwen_vanilla_bf16", "qwen_vanilla_fp32")
               for s in arms[row].seeds if arms[row].change(s, k)]
    row, seed = max(trained, key=lambda rs: abs(arms[rs[0]].change(rs[1], k).mean))
    v["qwen_largest_owntrace_change_k40"] = value(change(row, seed).mean, "the largest in size over trained Qwen "
                                                  f"arms and seeds: {change_text(row, seed)}", arms[row].where())
    untrained = arms["qwen_untrained"]
    v["untrained_qwen_owntrace_change"] = value(change("qwen_untrained", untrained.seeds[0]).mean,
                                                change_text("qwen_untrained", untrained.seeds[0]), untrained.where())
    for family in ("qwen", "smollm"):
        counts = [arms[row].measurable(s, k) for row in arms if row.startswith(f"{family}_") for s in arms[row].seeds]
        v[f"{family}_owntrace_coverage"] = value([min(counts), max(counts)], "fewest and most test notes with a "
                                                 f"measurable own-trace P2C recovery over the {family} arms and seeds",
                                                 f"{artifacts}/own-trace/M6")

    # -- the SmolLM3 student ------------------------------------------------------------------------------
    smol, smol_v = arms["smollm_mistill"], arms["smollm_vanilla_fp32"]
    v["smollm_mistill_owntrace_change"] = value(
        [change("smollm_mistill", s).mean for s in first_two],
        "; ".join(change_text("smollm_mistill", s) for s in first_two), smol.where())
    v["smollm_fp32_vanilla_owntrace_change"] = value(change("smollm_vanilla_fp32", s0).mean,
                                                     change_text("smollm_vanilla_fp32", s0), smol_v.where())
    v["smollm_owntrace_mistill_vs_vanilla"] = value(
        [arm.mean(s, k) for arm in (smol, smol_v) for s in first_two],
        f"mean over notes of the own top-{k} P2C recovery on own traces: Mistill seeds {first_two}, then fp32 Vanilla "
        f"CoT-KD seeds {first_two}; notes {[arm.measurable(s, k) for arm in (smol, smol_v) for s in first_two]}",
        f"{smol.where()} vs {smol_v.where()}")
    return v, sorted(set(inputs))


def main() -> int:
    return main_for("R-D29", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
