"""R-D14 (Sec. 4.5, Figure 2, App. M.1, Table 51): phase, term and dose ablations of the Mistill recipe.

Five recipe variants of the Qwen student at seed 0 (params variants.arms), each changing one thing:

    p1only     lambda_P2 = 0: phase-1 (chapter) supervision alone
    p2only     lambda_P1 = 0: phase-2 (within-chapter) supervision alone
    attnonly   the attention term alone (terms [attn])
    interonly  the interaction term alone (terms [inter])
    lam003     lambda_P1 = lambda_P2 = 0.03, the paper's third of its selected 0.1

and RandHeads at seed 1 (random heads from the top-k pool's layers, pool seed 1), read for its task alone.
Read beside each other, Mistill and the untrained student at seed 0
(`mistill.evaluate.variants.VariantReadout`):

* own-heads knock-in recovery at P2C (median over test notes of the per-note mean recovery of the arm's own
  top-k, k the largest of evaluate.own_heads.bins, the paper's 40; attention-only also at the smallest, the
  paper's 8);
* corpus micro-F1 on the test notes, and each variant minus Mistill as the mean per-note F1 difference with
  its bootstrap interval (the paper's "vs Mistill" intervals);
* the paired per-note differences at P2C the paper states: P2-only minus P1-only, P2-only, attention-only
  and interaction-only minus the untrained student, and attention-only against interaction-only (its sign p).
"""

from __future__ import annotations

from pathlib import Path

from mistill.evaluate.readout import main_for
from mistill.evaluate.variants import VariantReadout

READER = "readers/r_d14.py"

# variant name (params variants.arms) -> the paper's key stem
ABLATIONS = {"p1only": "p1only", "p2only": "p2only", "attnonly": "attnonly", "interonly": "interonly",
             "lam003": "lambda_003_003"}
NAMES = {"p1only": "P1-only", "p2only": "P2-only", "attnonly": "attention-only", "interonly": "interaction-only",
         "lam003": "lambda 0.03 / 0.03"}
RANDHEADS = "randheads1"
UNTRAINED_PAIRS = ("p2only", "attnonly", "interonly")


def keys(params: dict) -> list[str]:
    stems = list(ABLATIONS.values())
    return ([f"qwen_{stem}_own_p2c" for stem in stems]
            + [f"qwen_{ABLATIONS[n]}_microf1" for n in ("p1only", "p2only", "lam003", "attnonly", "interonly")]
            + ["p2only_minus_p1only", "p2only_minus_untrained", "attnonly_vs_interonly_p",
               "attnonly_minus_untrained", "interonly_minus_untrained", "qwen_attnonly_own_p2c_k8",
               "qwen_randheads_seed1_microf1",
               # registry extra_keys
               *(f"{stem}_minus_mistill_f1{tail}" for stem in stems for tail in ("", "_interval")),
               "attnonly_minus_interonly", "p2only_minus_p1only_interval",
               *(f"{n}_minus_untrained_interval" for n in UNTRAINED_PAIRS),
               "mistill_s0_own_p2c", "untrained_own_p2c"])


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    first, *others = ABLATIONS
    read = VariantReadout(first, params, others=tuple(others))
    arm = {name: "variant" if name == first else name for name in ABLATIONS}   # the readout's arm names
    cells: dict = {}
    for name, stem in ABLATIONS.items():
        cells[f"qwen_{stem}_own_p2c"] = read.own_value(arm[name], "P2C")
        cells[f"qwen_{stem}_microf1"] = read.f1_value(arm[name])
    cells["qwen_attnonly_own_p2c_k8"] = read.own_value(arm["attnonly"], "P2C", k=read.k_small)
    cells["mistill_s0_own_p2c"] = read.own_value("mistill", "P2C")
    cells["untrained_own_p2c"] = read.own_value("untrained", "P2C")
    v = {key: cell for key, cell in cells.items() if cell is not None}

    for name, stem in ABLATIONS.items():
        v.update(read.f1_versus_values(f"{stem}_minus_mistill_f1", f"{NAMES[name]} minus Mistill", "mistill",
                                       arm=arm[name]))
    v.update(read.paired_values("p2only_minus_p1only", "P2-only minus P1-only", arm["p1only"], arm=arm["p2only"]))
    for name in UNTRAINED_PAIRS:
        v.update(read.paired_values(f"{name}_minus_untrained", f"{NAMES[name]} minus the untrained student",
                                    "untrained", arm=arm[name]))
    v.update(read.paired_values("attnonly_minus_interonly", "attention-only minus interaction-only",
                                arm["interonly"], arm=arm["attnonly"], interval=False))
    c = read.versus(arm["attnonly"], arm["interonly"], "P2C")
    if c is not None:
        v["attnonly_vs_interonly_p"] = {
            **v["attnonly_minus_interonly"], "value": c["sign_p"],
            "statistic": f"two-sided sign-test p of attention-only against interaction-only (own top-{read.k} P2C "
                         f"recovery per note, seed {read.seed}; {c['notes_higher']} higher / {c['notes_lower']} lower "
                         f"of {c['n_notes']})"}

    randheads = VariantReadout(RANDHEADS, params)
    v["qwen_randheads_seed1_microf1"] = randheads.f1_value("variant")
    return v, sorted(set(read.inputs) | set(randheads.inputs))


def main() -> int:
    return main_for("R-D14", READER, compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
