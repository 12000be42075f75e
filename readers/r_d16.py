"""R-D16 (App. L.6): the instrument checks on one trained checkpoint, the gate and the second read.

Reads three reads of the arm params `reread` names (`mistill.evaluate.reread`): the arm's own-heads
chain (HD-S/ and M6/<arm>-s<seed> under paths.artifacts), the gate (its knock-in run alone on those
head sets, `reread.gate_dir`) and the second read (the whole chain again under other kernels,
`reread.second_read_dir`). Keys keep the paper's names; the knock-in size is the largest of
evaluate.own_heads.bins (the paper's k=40) and each value's statistic says which it is.
"""

from __future__ import annotations

from pathlib import Path

from mistill.errors import UserError
from mistill.evaluate.own_heads import OwnHeadsConfig
from mistill.evaluate.readout import main_for
from mistill.evaluate.reread import Read, reread_summary
from mistill.stats import StatsParams

READER = "readers/r_d16.py"
PHASES = ("P2C", "P2", "P1")


def keys(params: dict) -> list[str]:
    """Every key this reader writes."""
    return ["gate_largest_difference", *(f"crosshw_per_note_diff_{p.lower()}" for p in PHASES),
            "crosshw_sign_p_p2c_p2_p1", "crosshw_median_read_difference", "gate_raw_margin_difference",
            "crosshw_same_top_k_phases"]


def reads(params: dict) -> tuple[Read, Read, Read]:
    """(the chain's read, the gate's, the second read) of the arm params `reread` names."""
    section = params.get("reread")
    if not section:
        raise UserError("params.yaml: the active profile has no `reread` section (App. L.6, R-D16)")
    try:
        arm, seed = str(section["arm"]), int(section["seed"])
        roots = (Path(OwnHeadsConfig.from_params(params).artifacts), Path(section["gate_dir"]),
                 Path(section["second_read_dir"]))
    except KeyError as err:
        raise UserError(f"params.yaml reread: missing {err}") from None
    return tuple(Read(root, arm, seed) for root in roots)


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    cfg = OwnHeadsConfig.from_params(params)
    first, gate, second = reads(params)
    summary = reread_summary(first, gate, second, bins=cfg.bins, stats=StatsParams.from_params(params),
                             min_range=cfg.min_range)
    k, per_note = summary["k"], summary["per_note"]
    chain, gated, again = str(first.m6), str(gate.m6), f"{second.hd}, {second.m6}"

    def value(v, statistic: str, artifact: str) -> dict:
        return {"value": v, "statistic": statistic, "artifact": artifact}

    v = {
        "gate_largest_difference": value(
            summary["gate_largest_difference"], f"max over phases and k in {list(cfg.bins)} of |median over notes of "
            "per-note own top-k recovery, knock-in alone on the stored head sets - the chain|", f"{chain}, {gated}"),
        "crosshw_sign_p_p2c_p2_p1": value(
            [per_note[p]["sign_p"] for p in PHASES], f"two-sided sign test over notes of the per-note own top-{k} "
            "recovery difference, second read - first; [P2C, P2, P1]", f"{chain}, {again}"),
        "crosshw_median_read_difference": value(
            summary["p2c_cell_difference"], f"median over notes of own top-{k} P2C recovery, second read minus first",
            f"{chain}, {again}"),
        "gate_raw_margin_difference": value(
            summary["clean_margin_difference"], f"nats, median over {summary['clean_margin_events']} knock-in events "
            "of |clean margin, second read - first|", f"{chain}, {again}"),
        "crosshw_same_top_k_phases": value(
            summary["same_top_k_phases"], f"count of {summary['ranked_phases']} phases with the same own top-{k} "
            "set in both reads", f"{first.hd}, {second.hd}"),
    }
    for phase in PHASES:
        c = per_note[phase]
        v[f"crosshw_per_note_diff_{phase.lower()}"] = value(
            c["median_difference"], f"median over {c['n_notes']} test notes of the per-note own top-{k} {phase} "
            f"recovery difference, second read - first; {c['notes_higher']} higher / {c['notes_lower']} lower",
            f"{chain}, {again}")
    return v, [first.hd, first.m6, gate.m6, second.hd, second.m6]


if __name__ == "__main__":
    raise SystemExit(main_for("R-D16", READER, compute_values, keys))
