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

from mistill.evaluate.available_pairs import available_pair_comparison
from mistill.evaluate.own_heads import OwnHeadsConfig
from mistill.evaluate.own_trace_readout import OwnTraceArm
from mistill.evaluate.own_traces import own_trace_root
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
    """Every key whose notes exist: a cell with no note carrying it (an arm whose own traces leave no measurable
    event) is left out, and the check reports it as not reproduced."""
    cfg = OwnHeadsConfig.from_params(params)
    k, k8 = max(cfg.bins), min(cfg.bins)
    stats = StatsParams.from_params(params)
    artifacts = Path(cfg.artifacts)
    arms = {row: OwnTraceArm(label, artifacts, own_trace_root(artifacts), cfg.min_range)
            for row, label in arm_labels(params).items()}
    first_two, s0 = training_seeds(params)[:2], training_seeds(params)[0]
    v: dict[str, dict] = {}
    inputs = [p for arm in arms.values() for p in arm.inputs()]   # an arm without a readout: a UserError naming it

    def put(key: str, x, statistic: str, artifact: str) -> None:
        if x is not None and not (isinstance(x, list) and any(e is None for e in x)):
            v[key] = value(x, statistic, artifact)

    def change(row: str, seed: int, kk: int = k):
        return arms[row].change(seed, kk) if seed in arms[row].seeds else None

    def change_text(row: str, seed: int, kk: int = k) -> str:
        c = change(row, seed, kk)
        return (f"mean over {c.n} notes of own-trace minus teacher-forced own top-{kk} P2C recovery, "
                f"{arms[row].label} seed {seed}, {c.higher} higher")

    # -- Table 49's rows ------------------------------------------------------------------------------------
    for row, arm in arms.items():
        seeds, own, forced = arm.seeds, arm.where(), arm.where(forced=True)
        per_seed = f"per seed {seeds}"
        put(f"{row}_owntrace_p2c_k40_seeds", [arm.mean(s, k) for s in seeds], f"mean over notes of the own top-{k} "
            f"P2C recovery on the arm's own completed traces, {per_seed}", own)
        put(f"{row}_owntrace_random_p2c_k40_seeds", [arm.mean(s, k, "random") for s in seeds], f"mean over notes of "
            f"the P2C recovery of count-matched random {k}-head sets on the own traces, {per_seed}", own)
        put(f"{row}_owntrace_p2c_k8_seeds", [arm.mean(s, k8) for s in seeds], f"the same for the own top-{k8}, "
            f"{per_seed}", own)
        for kk, key in ((k, "forced_p2c_k40_same_notes"), (k8, "forced_p2c_k8_same_notes")):
            cells = [change(row, s, kk) for s in seeds]
            put(f"{row}_{key}_seeds", [c.forced if c else None for c in cells], f"mean of the teacher-forced own "
                f"top-{kk} P2C recovery on the notes with an own-trace value, {per_seed}", f"{forced} vs {own}")
        put(f"{row}_owntrace_coverage_seeds", [arm.measurable(s, k) for s in seeds], f"test notes with a measurable "
            f"own-trace P2C recovery at k {k}, {per_seed}", own)
        put(f"{row}_completed_seeds", [arm.completed(s) for s in seeds], f"test generations whose reasoning block "
            f"closes before the cap, of {arm.generated(seeds[0])}, {per_seed}", own)

    # -- the Qwen student ----------------------------------------------------------------------------------
    mistill = arms["qwen_mistill"]
    c = change("qwen_mistill", s0)
    if c is not None:
        put("mistill_s0_owntrace_p2c_k40", c.own, f"mean over the {c.n} notes with both values of the own top-{k} "
            f"P2C recovery on the own traces, Mistill seed {s0}", mistill.where())
        put("mistill_s0_forced_p2c_k40_same_notes", c.forced, f"the teacher-forced value on those {c.n} notes",
            mistill.where(forced=True))
    for tag in ("bf16", "fp32"):
        ref = arms[f"qwen_vanilla_{tag}"]
        art = f"{mistill.where()} vs {ref.where()}"
        for kk, suffix in ((k, "k40"), (k8, "k8")):
            cmp = available_pair_comparison(mistill.values(kk), ref.values(kk), stats)
            if cmp is None:
                continue
            key = f"mistill_minus_{tag}_vanilla_owntrace_{suffix}"
            pairs = ", ".join(f"{p['n_notes']}" for p in cmp["seed_pairs"])
            put(key, cmp["mean_difference"], f"Mistill minus {tag} Vanilla CoT-KD, own top-{kk} P2C recovery on own "
                f"traces: {cmp['statistic']}; common notes per pair {pairs}; {cmp['notes_higher']} higher of "
                f"{cmp['n_notes']}", art)
            if kk == k:
                put(f"{key}_interval", [cmp["ci_low"], cmp["ci_high"]], f"{cmp['confidence']:.0%} note-bootstrap "
                    "interval of that mean", art)
                if tag == "bf16":
                    put(f"{key}_higher_notes", cmp["notes_higher"], f"notes with a positive per-note mean "
                        f"difference, of {cmp['n_notes']}", art)
    trained = [(row, s) for row in ("qwen_mistill", "qwen_vanilla_bf16", "qwen_vanilla_fp32")
               for s in arms[row].seeds if change(row, s)]
    if trained:
        row, seed = max(trained, key=lambda rs: abs(change(*rs).mean))
        put("qwen_largest_owntrace_change_k40", change(row, seed).mean, "the largest in size over trained Qwen arms "
            f"and seeds: {change_text(row, seed)}", arms[row].where())
    untrained = arms["qwen_untrained"]
    if change("qwen_untrained", untrained.seeds[0]):
        put("untrained_qwen_owntrace_change", change("qwen_untrained", untrained.seeds[0]).mean,
            change_text("qwen_untrained", untrained.seeds[0]), untrained.where())
    for family in ("qwen", "smollm"):
        counts = [arms[row].measurable(s, k) for row in arms if row.startswith(f"{family}_") for s in arms[row].seeds]
        put(f"{family}_owntrace_coverage", [min(counts), max(counts)], "fewest and most test notes with a measurable "
            f"own-trace P2C recovery over the {family} arms and seeds", f"{artifacts}/own-trace/M6")

    # -- the SmolLM3 student ------------------------------------------------------------------------------
    smol, smol_v = arms["smollm_mistill"], arms["smollm_vanilla_fp32"]
    if all(change("smollm_mistill", s) for s in first_two):
        put("smollm_mistill_owntrace_change", [change("smollm_mistill", s).mean for s in first_two],
            "; ".join(change_text("smollm_mistill", s) for s in first_two), smol.where())
    if change("smollm_vanilla_fp32", s0):
        put("smollm_fp32_vanilla_owntrace_change", change("smollm_vanilla_fp32", s0).mean,
            change_text("smollm_vanilla_fp32", s0), smol_v.where())
    put("smollm_owntrace_mistill_vs_vanilla", [arm.mean(s, k) for arm in (smol, smol_v) for s in first_two],
        f"mean over notes of the own top-{k} P2C recovery on own traces: Mistill seeds {first_two}, then fp32 Vanilla "
        f"CoT-KD seeds {first_two}; notes {[arm.measurable(s, k) for arm in (smol, smol_v) for s in first_two]}",
        f"{smol.where()} vs {smol_v.where()}")
    return v, sorted(set(inputs))


def main() -> int:
    return main_for("R-D29", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
