"""R-D13 (Sec. 4.5, App. M.1 and M.3, Tables 50 and 51): which and how many heads are supervised.

Recipe variants (params variants.arms) that change the supervised pool and nothing else:

    bottom, smolbottom, smolbottom1   the most negatively ranked heads of the untrained student, with the top
                                      pool's weight profile (Qwen seed 0; SmolLM3 seeds 0 and 1)
    k8, k100, smolk8                  pools of the paper's 8 and 100 heads instead of 40
    randheads, smolrandheads          random heads of the top pool's layers (the reference of App. M.1's
                                      "minus RandHeads")

read beside Mistill and the untrained student of the same student (`mistill.evaluate.variants`):

* own-heads knock-in recovery at P2C and P2 (median over test notes of the per-note mean recovery of the arm's
  own top-k, k the largest of evaluate.own_heads.bins, the paper's 40), and its mean at the smallest k (the
  paper's top-8 "concentration", App. M.3);
* paired per-note differences at P2C: bottom minus the untrained student (notes lower), SmolLM3's bottom and
  k8 pools minus RandHeads and k8 minus bottom, per bottom seed (a single pair each, across seeds where the
  paper pairs them so);
* which heads carry the decision after training: how many of each arm's own top-k are the untrained
  student's own top-k (every arm read here, every phase), and how many of the bottom pool's supervised heads
  end among SmolLM3's own top-k;
* the untrained student's summed importance I_c at P2C over the bottom pool's heads (and over its top pool);
* M2 region lift and emitted-prefix share of the own top read-side heads at P2C, and corpus micro-F1.

SmolLM3's Mistill cells list its seeds 0 and 1 where the profile trains them (params distill.seeds).
"""

from __future__ import annotations

from pathlib import Path

from mistill.evaluate.readout import main_for, training_seeds, value
from mistill.evaluate.variants import VariantReadout, across

READER = "readers/r_d13.py"
SMOL_MISTILL_SEEDS = (0, 1)   # App. J.4: two SmolLM3-3B Mistill seeds


def keys(params: dict) -> list[str]:
    return ["qwen_bottom40_own_p2c", "smollm_bottom40_own_p2c_seeds", "qwen_k8_own_p2c", "smollm_k8_own_p2c",
            "qwen_k100_own_p2c", "carriers_shared_with_untrained_top40", "qwen_bottom40_lower_than_untrained_notes",
            "smollm_bottom40_minus_randheads", "smollm_k8_minus_randheads", "smollm_k8_minus_bottom40",
            "smollm_p2_bottom40_k8_mistill", "qwen_p2_k100_randheads_bottom_mistill_untrained",
            "smollm_top8_concentration_bottom40_mistill_k8", "qwen_top8_concentration_bottom40_vs_mistill",
            "bottom40_supervised_heads_in_own_top40", "smollm_bottom40_importance_sum", "qwen_bottom40_importance_sum",
            "smollm_m2_k8_mistill_bottom40", "smollm_prefix_bottom40_randheads_k8_mistill", "smollm_bottom40_task",
            "smollm_k8_task", "qwen_bottom40_task",
            # registry extra_keys
            "smollm_top40_importance_sum", "qwen_top40_importance_sum", "qwen_bottom40_minus_untrained",
            "smollm_bottom40_minus_mistill_f1", "smollm_bottom40_minus_mistill_f1_interval",
            "smollm_k8_minus_mistill_f1", "smollm_k8_minus_mistill_f1_interval"]


class Readouts:
    """The three readouts (Qwen seed 0, SmolLM3 seeds 0 and 1) and the values they give."""

    def __init__(self, params: dict):
        self.qwen = VariantReadout("bottom", params, others=("k8", "k100", "randheads"))
        self.smol = VariantReadout("smolbottom", params, others=("smolk8", "smolrandheads"))
        self.smol1 = VariantReadout("smolbottom1", params)
        self.mistill_seeds = [s for s in SMOL_MISTILL_SEEDS if s in training_seeds(params)]

    @property
    def inputs(self) -> list[Path]:
        return sorted({*self.qwen.inputs, *self.smol.inputs, *self.smol1.inputs})

    def smol_mistill(self):
        """SmolLM3's Mistill readouts at the seeds the profile trains: (readout, seed) pairs."""
        return [(self.smol if seed == self.smol.seed else self.smol1, seed) for seed in self.mistill_seeds]

    def where(self, *cells: tuple[VariantReadout, str]) -> str:
        return ", ".join(read.where(arm) for read, arm in cells)


def _difference(a: dict, b: dict, stats) -> float:
    return across(a, b, stats)["mean_difference"]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    r = Readouts(params)
    q, s, s1 = r.qwen, r.smol, r.smol1
    k, k8 = q.k, q.k_small
    v: dict = {}
    for key, read, arm in (("qwen_bottom40_own_p2c", q, "variant"), ("qwen_k8_own_p2c", q, "k8"),
                           ("qwen_k100_own_p2c", q, "k100"), ("smollm_k8_own_p2c", s, "smolk8")):
        v[key] = read.own_value(arm, "P2C")
    v["smollm_bottom40_own_p2c_seeds"] = value(
        [s.own_median("variant", "P2C"), s1.own_median("variant", "P2C")],
        f"medians over test notes of per-note mean recovery (own top-{k}, P2C), bottom pool seeds {s.seed} and "
        f"{s1.seed}", r.where((s, "variant"), (s1, "variant")))

    below = q.versus("variant", "untrained", "P2C")
    v["qwen_bottom40_lower_than_untrained_notes"] = value(
        below["notes_lower"], f"notes where the bottom pool's own top-{k} P2C recovery is below the untrained "
        f"student's, of {below['n_notes']} (seed {q.seed})", f"{q.where('variant')} vs {q.where('untrained')}")
    v["qwen_bottom40_minus_untrained"] = value(
        below["mean_difference"], f"mean over notes of the per-note difference, bottom pool minus the untrained "
        f"student (own top-{k} P2C recovery, seed {q.seed}); sign p {below['sign_p']:.3g}",
        f"{q.where('variant')} vs {q.where('untrained')}")

    stats = s.stats
    randheads = s.notes_of("smolrandheads", "P2C")
    bottoms = [(s, s.notes_of("variant", "P2C")), (s1, s1.notes_of("variant", "P2C"))]
    v["smollm_bottom40_minus_randheads"] = value(
        [_difference(b, randheads, stats) for _, b in bottoms],
        f"per bottom seed ({s.seed}, {s1.seed}): mean over notes of the per-note difference, bottom pool minus "
        f"RandHeads seed {s.seed} (own top-{k} P2C recovery)",
        r.where((s, "variant"), (s1, "variant"), (s, "smolrandheads")))
    v.update(s.paired_values("smollm_k8_minus_randheads", "pool of 8 minus RandHeads", "smolrandheads",
                             arm="smolk8", interval=False))
    k8_notes = s.notes_of("smolk8", "P2C")
    v["smollm_k8_minus_bottom40"] = value(
        [_difference(k8_notes, b, stats) for _, b in bottoms],
        f"per bottom seed ({s.seed}, {s1.seed}): mean over notes of the per-note difference, pool of 8 minus the "
        f"bottom pool (own top-{k} P2C recovery)", r.where((s, "smolk8"), (s, "variant"), (s1, "variant")))

    mistill = r.smol_mistill()
    v["smollm_p2_bottom40_k8_mistill"] = value(
        [s.own_median("variant", "P2"), s1.own_median("variant", "P2"), s.own_median("smolk8", "P2")]
        + [read.own_median("mistill", "P2") for read, _ in mistill],
        f"medians over test notes of per-note mean recovery (own top-{k}, P2): bottom seeds {s.seed} and {s1.seed}, "
        f"pool of 8, Mistill seeds {[seed for _, seed in mistill]}", r.where((s, "variant"), (s1, "variant")))
    v["qwen_p2_k100_randheads_bottom_mistill_untrained"] = value(
        [q.own_median(arm, "P2") for arm in ("k100", "randheads", "variant", "mistill", "untrained")],
        f"medians over test notes of per-note mean recovery (own top-{k}, P2), seed {q.seed}: pool of 100, "
        "RandHeads, bottom pool, Mistill, untrained", q.where("variant"))

    v["smollm_top8_concentration_bottom40_mistill_k8"] = value(
        [s.mean_recovery("variant", "P2C"), s1.mean_recovery("variant", "P2C")]
        + [read.mean_recovery("mistill", "P2C") for read, _ in mistill] + [s.mean_recovery("smolk8", "P2C")],
        f"means over test notes of per-note recovery of the own top-{k8} at P2C: bottom seeds {s.seed} and "
        f"{s1.seed}, Mistill seeds {[seed for _, seed in mistill]}, pool of 8", r.where((s, "variant")))
    top8 = q.versus("variant", "mistill", "P2C", k8)
    v["qwen_top8_concentration_bottom40_vs_mistill"] = value(
        [q.mean_recovery("variant", "P2C"), q.mean_recovery("mistill", "P2C")],
        f"means over test notes of per-note recovery of the own top-{k8} at P2C, bottom pool and Mistill (seed "
        f"{q.seed}); bottom lower on {top8['notes_lower']} of {top8['n_notes']} notes",
        f"{q.where('variant')} vs {q.where('mistill')}")

    v["carriers_shared_with_untrained_top40"] = _carriers(r)
    v["bottom40_supervised_heads_in_own_top40"] = _supervised_in_own_top(s)
    for family, read in (("smollm", s), ("qwen", q)):
        bottom, top = _importance_sums(read)
        what = (f"sum over the {{}} pool's {len(read.supervised()['P2C'])} heads at P2C of the untrained student's "
                "importance, nats")
        v[f"{family}_bottom40_importance_sum"] = value(bottom, what.format("bottom"), read.hd_dir("untrained"))
        v[f"{family}_top40_importance_sum"] = value(top, what.format("top"), read.hd_dir("untrained"))

    v["smollm_m2_k8_mistill_bottom40"] = value(
        [s.m2_lift(arm, "P2C") for arm in ("smolk8", "mistill", "variant")],
        f"M2 region lift of the own top-{s.cfg.readside_k} read-side heads at P2C, median over test notes, seed "
        f"{s.seed}: pool of 8, Mistill, bottom pool", s.where("variant"))
    v["smollm_prefix_bottom40_randheads_k8_mistill"] = value(
        [s.prefix_share(arm) for arm in ("variant", "smolrandheads", "smolk8", "mistill")],
        f"emitted-prefix share of attention of the own top-{s.cfg.readside_k} read-side heads at P2C, seed "
        f"{s.seed}: bottom pool, RandHeads, pool of 8, Mistill", s.where("variant"))

    f1 = [s.micro_f1("variant"), s1.micro_f1("variant")]
    v["smollm_bottom40_task"] = value(sum(f1) / len(f1), f"mean over bottom seeds {s.seed} and {s1.seed} of corpus "
                                      "micro-F1 on the test notes", r.where((s, "variant"), (s1, "variant")))
    v["smollm_k8_task"] = s.f1_value("smolk8")
    v["qwen_bottom40_task"] = q.f1_value("variant")
    v.update(s.f1_versus_values("smollm_bottom40_minus_mistill_f1", "bottom pool minus Mistill", "mistill"))
    v.update(s.f1_versus_values("smollm_k8_minus_mistill_f1", "pool of 8 minus Mistill", "mistill", arm="smolk8"))
    return v, r.inputs


def _carriers(r: Readouts) -> dict:
    """Range over every trained arm read here and every phase of |own top-k after training ∩ the untrained
    student's own top-k|."""
    reads = ((r.qwen, ("variant", "k8", "k100", "randheads", "mistill")),
             (r.smol, ("variant", "smolk8", "smolrandheads", "mistill")), (r.smol1, ("variant",)))
    counts = []
    for read, arms in reads:
        untrained = read.own_top("untrained")
        for arm in arms:
            own = read.own_top(arm)
            counts += [len(own[p] & untrained[p]) for p in sorted(own) if p in untrained]
    n_arms, k = sum(len(arms) for _, arms in reads), r.qwen.k
    return value([min(counts), max(counts)], f"range of counts of {k} over {n_arms} trained arms and every phase: "
                 f"heads of the arm's own top-{k} that are the untrained student's own top-{k}", r.qwen.where("variant"))


def _supervised_in_own_top(read: VariantReadout) -> dict:
    """How many of the bottom pool's supervised heads are among the arm's own top-k after training, per phase."""
    n_heads = int(read.ranking("variant")["n_heads"])
    own, pools = read.own_top("variant"), read.supervised()
    counts = [len({layer * n_heads + head for layer, head in pools[p]} & own[p]) for p in ("P1", "P2", "P2C")]
    return value(counts, f"counts at P1, P2 and P2C of the bottom pool's supervised heads among the arm's own "
                 f"top-{read.k} after training (seed {read.seed})", read.hd_dir("variant"))


def _importance_sums(read: VariantReadout) -> tuple[float, float]:
    """(sum of the untrained student's I_c at P2C over the bottom pool's heads, the same over its top-k)."""
    ranking = read.ranking("untrained")["phases"]["P2C"]
    ic = {(int(row["layer"]), int(row["head"])): float(row["ic"]) for row in ranking}
    pool = read.supervised()["P2C"]
    return sum(ic[h] for h in pool), sum(float(row["ic"]) for row in ranking[:len(pool)])


def main() -> int:
    return main_for("R-D13", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
