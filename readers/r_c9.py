"""R-C9 (Sec. 2.2, App. C Table 5; App. E Table 24): the blinded audit of contrastive events.

From HD-001-audit (`mistill evaluate audit-frame`, `audit-labels`; `mistill.evaluate.audit`): the class
shares of the audited events (raw, with Clopper-Pearson 95% intervals, and weighted by the strata's
population sizes), the clinically meaningful share, and the rejection share among events whose code
reaches the final answer and among those whose code does not.

Table 24's restricted reads, from the own-heads chain (M6/<arm>-s0/, every row of
evaluate.own_heads.arms whose seed 0 exists): at each audited event the arm realises (the App. I.1
anchor rule, the arm's events.jsonl), M1 = the share of events where the student's own clean margin
favours the teacher's choice (margin > 0), and the own top-k knock-in recovery (k = the largest of
evaluate.own_heads.bins; the 1-nat range gate), on the verified rejections and on the other labelled
events.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mistill.evaluate.audit import AuditConfig, ContrastiveEvent, audit_readout, load_audit
from mistill.evaluate.compare import knockin_rows
from mistill.evaluate.own_heads import OwnHeadsConfig
from mistill.instrument.readout import run_reader, value
from mistill.io import read_jsonl
from mistill.stats import knock_in_recovery

READER = "readers/r_c9.py"

CLASS_KEYS = {"rejection": "verified_rejection", "enumeration": "enumeration", "both_endorsed": "both_endorsed",
              "other": "other"}


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params` (Table 24 rows: evaluate.own_heads.arms)."""
    out = ["verified_rejection_share", "verified_rejection_share_weighted", "enumeration_share",
           "clinically_meaningful_share", "enumeration_share_weighted", "both_endorsed_share", "other_share",
           "rejection_share_final_answer_codes", "rejection_share_not_final_answer_codes", "audited_events",
           "contrastive_event_population", "both_endorsed_share_weighted", "other_share_weighted"]
    out += [f"{CLASS_KEYS[c]}_share_interval" for c in CLASS_KEYS] + ["clinically_meaningful_share_interval"]
    rows = set((params["evaluate"]["own_heads"].get("arms") or {}))
    if "qwen_mistill" in rows:
        out += ["mistill_s0_m1_verified_rejections", "mistill_s0_m1_other_labeled", "patched_events_rejections_other"]
    out += [f"table24_{row}" for row in sorted(rows)]
    return out


def realised_rows(m6_dir: Path, audited: dict[str, ContrastiveEvent]) -> dict[str, dict]:
    """item -> the arm's knock-in row (patch2.jsonl) at the audited event, where the arm realises it."""
    rows_by_note = knockin_rows(m6_dir)
    # the arm's P2C positions by anchor, one read of each note's events
    positions = {note: {int(e["anchor"]): e["pos"] for e in read_jsonl(m6_dir / note / "events.jsonl")
                        if e["kind"] == "P2C"}
                 for note in {e.note_id for e in audited.values()} if note in rows_by_note}
    out = {}
    for item, event in audited.items():
        if event.note_id not in rows_by_note:
            continue
        pos = positions[event.note_id].get(event.anchor)
        row = next((r for r in rows_by_note[event.note_id] if r["kind"] == "P2C" and r["pos"] == pos), None)
        if row is not None:
            out[item] = row
    return out


def restricted_reads(rows: dict[str, dict], items: list[str], k: int, min_range: float) -> dict:
    """M1 share and mean knock-in recovery (own top-k, gated) over `items`, with their event counts."""
    got = [rows[i] for i in items if i in rows]
    m1 = float(np.mean([r["margin_clean"] > 0 for r in got])) if got else float("nan")
    knocked = [r for r in got if r.get("margin_all") is not None and str(k) in (r.get("knockin") or {}).get("top", {})]
    recovery = (knock_in_recovery([r["knockin"]["top"][str(k)] for r in knocked], [r["margin_corr"] for r in knocked],
                                  [r["margin_all"] for r in knocked], min_range=min_range)
                if knocked else None)
    return {"m1": m1, "m1_events": len(got),
            "knockin": float(np.mean(recovery.recovery)) if recovery is not None and recovery.n_passed else float("nan"),
            "patched_events": recovery.n_passed if recovery is not None else 0}


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    cfg = AuditConfig.from_params(params)
    frame, key, labels = load_audit(cfg)
    readout = audit_readout(key, labels, frame)
    art = f"{cfg.out_dir}/labels.csv"
    n = readout["n"]
    v: dict[str, dict] = {
        "audited_events": value(n, "count of audited contrastive events (stratified draw)", art),
        "contrastive_event_population": value(sum(frame["population"].values()),
                                              "count of P2C events with an earlier mention of the near-miss", art)}
    for label, name in CLASS_KEYS.items():
        got = readout["classes"][label]
        v[f"{name}_share"] = value(got["percent"], f"percent of {n} (raw; {got['count']} events)", art)
        v[f"{name}_share_interval"] = value([got["low"], got["high"]], "percent, Clopper-Pearson 95% interval", art)
        v[f"{name}_share_weighted"] = value(got["weighted_percent"], "percent (population-weighted over the strata)",
                                            art)
    meaningful = readout["clinically_meaningful"]
    v["clinically_meaningful_share"] = value(meaningful["percent"], f"percent of {n}", art)
    v["clinically_meaningful_share_interval"] = value([meaningful["low"], meaningful["high"]],
                                                      "percent, Clopper-Pearson 95% interval", art)
    for name, where in (("final_answer", "rejection_share_final_answer_codes"),
                        ("not_final_answer", "rejection_share_not_final_answer_codes")):
        got = readout[f"rejection_{name}"]
        v[where] = value(got["percent"], f"percent of the {got['n']} audited events whose code is "
                         f"{'in' if name == 'final_answer' else 'not in'} the final answer", art)

    own = OwnHeadsConfig.from_params(params)
    k = max(own.bins)
    audited = {item: ContrastiveEvent.from_json(row) for item, row in key.items()}
    rejections = sorted(i for i in audited if labels[i][0] == "rejection")
    others = sorted(i for i in audited if labels[i][0] != "rejection")
    inputs = [cfg.path("frame.json"), cfg.path("key.json"), cfg.path("labels.csv")]
    for row, arm in sorted((params["evaluate"]["own_heads"].get("arms") or {}).items()):
        m6_dir = Path(own.artifacts) / "M6" / f"{arm}-s0"
        if not (m6_dir / "faithfulness2.json").exists():
            continue
        rows = realised_rows(m6_dir, audited)
        rej = restricted_reads(rows, rejections, k, own.min_range)
        oth = restricted_reads(rows, others, k, own.min_range)
        where = f"{m6_dir}/*/patch2.jsonl"
        inputs.append(m6_dir / "faithfulness2.json")
        v[f"table24_{row}"] = value(
            [rej["m1"], oth["m1"], rej["knockin"], oth["knockin"], rej["m1_events"], oth["m1_events"],
             rej["patched_events"], oth["patched_events"]],
            f"seed 0: [M1 verified rejections, M1 other labelled, own top-{k} knock-in recovery (1-nat gate) "
            "verified rejections, other labelled, events for M1 (2), patched events (2)]", where)
        if row == "qwen_mistill":
            v["mistill_s0_m1_verified_rejections"] = value(
                rej["m1"], f"M1 share, seed 0 (n={rej['m1_events']} events)", where)
            v["mistill_s0_m1_other_labeled"] = value(oth["m1"], f"M1 share, seed 0 (n={oth['m1_events']} events)",
                                                     where)
            v["patched_events_rejections_other"] = value(
                [rej["patched_events"], oth["patched_events"]],
                f"counts of gated events for the own top-{k} knock-in, seed 0", where)
    # a share over no events (a class, stratum group or arm with nothing audited) is not a number: left out,
    # so the check reports it as not reproduced instead of comparing a NaN
    return {k: x for k, x in v.items() if np.all(np.isfinite(np.asarray(x["value"], dtype=float)))}, inputs


def main() -> int:
    return run_reader("R-C9", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
