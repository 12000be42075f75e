"""R-D26 (Sec. 4.5, App. M.1, Table 51): RandHeads on one frozen random pool, and Mistill over four RandHeads runs.

Four RandHeads runs of the Qwen student (params variants.arms): `randheads` (seed 0, pool 0), `randheads1` (seed 1,
its own pool 1) and `randheadsp0s1`, `randheadsp0s2` (seeds 1 and 2 on the frozen pool 0). Own-heads knock-in
recovery at P2C of each run's own top-k, at the largest and smallest k of evaluate.own_heads.bins (the paper's 40
and 8):

* the frozen pool across training seeds: `randheadsp0s1` minus `randheads` per note (the training order alone);
* the pool at one seed: `randheads1` minus `randheadsp0s1`;
* Mistill minus RandHeads over the four runs, each against Mistill at its seed, note-clustered over the four pairs.
"""

from __future__ import annotations

from pathlib import Path

from mistill.errors import UserError
from mistill.evaluate.compare import clustered
from mistill.evaluate.readout import main_for, value
from mistill.evaluate.variants import VariantReadout, across

READER = "readers/r_d26.py"
RUNS = ("randheads", "randheads1", "randheadsp0s1", "randheadsp0s2")


def keys(params: dict) -> list[str]:
    return ["frozen_pool_seed_diff_k40", "mistill_minus_randheads_4runs_k40", "mistill_minus_randheads_4runs_k8",
            "frozen_pool_seed_diff_k40_notes", "frozen_pool_seed_diff_k8", "pool_effect_k40_k8",
            # registry extra_keys
            "mistill_minus_randheads_4runs_k40_interval", "mistill_minus_randheads_4runs_k8_interval"]


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    reads = {name: VariantReadout(name, params) for name in RUNS}
    first = reads[RUNS[0]]
    k, k8, stats = first.k, first.k_small, first.stats
    pools = {name: (int(r.entry["seed"]), int(r.entry.get("pool_seed", params["distill"]["pool_seed"])))
             for name, r in reads.items()}
    if pools != {"randheads": (0, 0), "randheads1": (1, 1), "randheadsp0s1": (1, 0), "randheadsp0s2": (2, 0)}:
        raise UserError(f"params variants.arms: the four RandHeads runs must be (seed, pool seed) (0, 0), (1, 1), "
                        f"(1, 0), (2, 0); found {pools}")

    def recovery(name: str, kk: int, arm: str = "variant") -> dict[str, float]:
        return reads[name].notes_of(arm, "P2C", kk)

    def art(*names: str) -> str:
        return " vs ".join(reads[n].where("variant") for n in names)

    v: dict[str, dict] = {}
    for kk, suffix in ((k, "k40"), (k8, "k8")):
        c = across(recovery("randheadsp0s1", kk), recovery("randheads", kk), stats)
        v[f"frozen_pool_seed_diff_{suffix}"] = value(
            c["mean_difference"], f"mean over notes of the per-note difference, pool 0 at seed 1 minus seed 0 (own "
            f"top-{kk} P2C recovery); {c['notes_higher']} higher / {c['notes_lower']} lower of {c['n_notes']}, sign p "
            f"{c['sign_p']:.3g}", art("randheadsp0s1", "randheads"))
        if suffix == "k40":
            v["frozen_pool_seed_diff_k40_notes"] = value(c["notes_higher"], f"notes higher, pool 0 at seed 1 minus seed "
                                                         f"0 (own top-{kk} P2C recovery), of {c['n_notes']}",
                                                         art("randheadsp0s1", "randheads"))
        pairs = clustered({i: recovery(n, kk, "mistill") for i, n in enumerate(RUNS)},
                          {i: recovery(n, kk) for i, n in enumerate(RUNS)}, stats)
        if pairs is None:
            raise UserError(f"{art(*RUNS)}: no test note read in every RandHeads run and Mistill at its seed")
        key = f"mistill_minus_randheads_4runs_{suffix}"
        where = ", ".join(reads[n].where(a) for n in RUNS for a in ("mistill", "variant"))
        v[key] = value(pairs["mean_difference"], f"note-clustered mean over the four RandHeads runs of Mistill at the "
                       f"run's seed minus the run (own top-{kk} P2C recovery); {pairs['notes_higher']} higher / "
                       f"{pairs['notes_lower']} lower of {pairs['n_notes']}, sign p {pairs['sign_p']:.3g}, Wilcoxon "
                       f"p {pairs['wilcoxon_p']:.3g}", where)
        v[f"{key}_interval"] = value([pairs["ci_low"], pairs["ci_high"]], f"{pairs['confidence']:.0%} note-bootstrap "
                                     f"interval of that mean ({stats.bootstrap_resamples} resamples, seed "
                                     f"{stats.bootstrap_seed})", where)
    effect = [across(recovery("randheads1", kk), recovery("randheadsp0s1", kk), stats)["mean_difference"]
              for kk in (k, k8)]
    v["pool_effect_k40_k8"] = value(effect, f"mean over notes of the per-note difference at seed 1, pool 1 minus pool "
                                    f"0 (own top-{k} and top-{k8} P2C recovery)", art("randheads1", "randheadsp0s1"))
    return v, sorted({p for r in reads.values() for p in r.inputs})


def main() -> int:
    return main_for("R-D26", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
