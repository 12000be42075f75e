"""R-C10 (Sec. 3.3, App. E, Table 20): blocking what the named heads read, at the decision token.

From HD-001-read's key_intervene.jsonl (`mistill instrument keys`, `mistill.instrument.keymask`): per
named read (the first two region readers' emitted chapter lines at P1; the first contrastive reader's,
and the contrastive pair's, earlier near-miss mentions at P2C; the pair's near-miss inventory line)
and event,

    D_named   = margin(empty key set) - margin(named keys blocked)     (the same masked path: kernel
    D_control = margin(empty key set) - margin(matched control keys)    noise cancels)
    E         = margin(clean) - margin(the heads mean-ablated)

* share of effect: the median of D_named / E over events where E exceeds read_side.key_block_min_effect
  (the paper's 0.1 nats);
* notes on which the named keys beat the control: per note the mean over its events of
  D_named - D_control, counted above zero; the mean over notes with its bootstrap interval;
* the sibling's inventory line: the pair's share of effect when only that line is blocked.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from mistill.errors import UserError
from mistill.instrument.read_passes import ReadSide
from mistill.instrument.readout import load_json, reader_settings, run_reader, value
from mistill.io import read_jsonl
from mistill.stats import StatsParams, bootstrap_mean, sign_test

READER = "readers/r_c10.py"


def _roles(params: dict) -> dict[str, tuple[str, str]]:
    """Key prefix -> (role in key_intervene.jsonl, phase) of every named read params implies."""
    heads = reader_settings(params).named_heads
    out = {name: (f"{name}:region", "P1") for name in heads.region_readers[:2]}
    contrastive = heads.contrastive_readers
    if contrastive:
        out[contrastive[0]] = (f"{contrastive[0]}:near_miss", "P2C")
    if len(contrastive) > 1:
        out["_".join(contrastive[:2])] = (f"{'+'.join(contrastive[:2])}:near_miss", "P2C")
    return out


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params` (the named heads from params)."""
    heads = reader_settings(params).named_heads
    out = [f"{name}_key_block_share_of_effect" for name in _roles(params)]
    if heads.contrastive_readers:
        out += ["notes_named_beat_control_p2c", f"{heads.contrastive_readers[0]}_matched_control_effect",
                "contrastive_events_with_earlier_sibling"]
    if len(heads.contrastive_readers) > 1:
        out += ["sibling_inventory_line_share"]
    if heads.region_readers:
        out += ["notes_named_beat_control_p1", "chapter_events"]
    for name in _roles(params):
        out += [f"{name}_key_block_effects", f"{name}_named_minus_control", f"{name}_named_minus_control_interval",
                f"{name}_notes_named_vs_control"]
    return out


def load_rows(out: Path) -> tuple[dict[str, list[dict]], list[str]]:
    """role -> rows of every note, and the notes."""
    summary = load_json(out / "key_reads.json")
    by_role: dict[str, list[dict]] = defaultdict(list)
    for note in summary["notes"]:
        path = out / note / "key_intervene.jsonl"
        if not path.exists():
            raise UserError(f"{path}: missing; run `mistill instrument keys` (stage HD-001-keys)")
        for row in read_jsonl(path):
            by_role[row["role"]].append({**row, "note": note})
    return by_role, summary["notes"]


def share_of_effect(rows: list[dict], min_effect: float) -> tuple[float | None, int]:
    """(median D_named / E over events with E > min_effect, how many such events)."""
    ratios = [r["D_named"] / r["E"] for r in rows if r["E"] > min_effect]
    return (float(np.median(ratios)) if ratios else None), len(ratios)


def named_minus_control_per_note(rows: list[dict]) -> dict[str, float]:
    """note -> mean over its events (with a control) of D_named - D_control."""
    by_note: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r["D_control"] is not None:
            by_note[r["note"]].append(r["D_named"] - r["D_control"])
    return {note: float(np.mean(v)) for note, v in by_note.items()}


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    side = ReadSide.from_params(params)
    out = side.pass_dir("keys")
    by_role, notes = load_rows(out)
    stats = StatsParams.from_params(params)
    heads = reader_settings(params).named_heads
    art = f"{out}/*/key_intervene.jsonl"
    floor = side.key_block_min_effect
    v: dict[str, dict] = {}
    beats: dict[str, tuple[int, int]] = {}
    for name, (role, phase) in _roles(params).items():
        rows = by_role.get(role, [])
        if not rows:      # no event of the role's phase has its named keys (no P2C event with an earlier N)
            continue
        share, n_big = share_of_effect(rows, floor)
        if share is not None:
            v[f"{name}_key_block_share_of_effect"] = value(
                share, f"median D/E over the {n_big} of {len(rows)} {phase} events with E above {floor} nats", art)
        big = [r for r in rows if r["E"] > floor]
        v[f"{name}_key_block_effects"] = value(
            [float(np.median([r["E"] for r in rows])), n_big / len(rows),
             float(np.median([r["D_named"] for r in big])) if big else 0.0,
             float(np.median([r["D_control"] for r in big if r["D_control"] is not None] or [0.0]))],
            f"[median E, share of events with E above {floor}, median D named, median D control over those "
            f"events], nats, {phase}", art)
        per_note = named_minus_control_per_note(rows)
        if not per_note:  # no control keys of the matching kind in any note
            continue
        test = sign_test(list(per_note.values()))
        beats[name] = (test.n_positive, test.n)
        interval = bootstrap_mean(list(per_note.values()), n_resamples=stats.bootstrap_resamples,
                                  seed=stats.bootstrap_seed, confidence=stats.confidence)
        v[f"{name}_named_minus_control"] = value(interval.estimate, f"nats, mean over {test.n} notes of the per-note "
                                                 "mean D named minus D control", art)
        v[f"{name}_named_minus_control_interval"] = value(
            [interval.low, interval.high], f"{stats.confidence:.0%} percentile bootstrap over notes", art)
        v[f"{name}_notes_named_vs_control"] = value(
            [test.n_positive, test.n_negative], f"notes higher and lower of {test.n} (sign test p {test.p_value:.3g})",
            art)
    if heads.contrastive_readers and heads.contrastive_readers[0] in beats:
        c = heads.contrastive_readers[0]
        higher, n = beats[c]
        v["notes_named_beat_control_p2c"] = value(higher, f"count of {n} notes, {c} named keys above control", art)
        rows = [r for r in by_role[f"{c}:near_miss"] if r["E"] > floor and r["D_control"] is not None]
        if rows:
            v[f"{c}_matched_control_effect"] = value(
                float(np.median([r["D_control"] for r in rows])),
                f"nats, median D control over {len(rows)} events with E above {floor} (named: "
                f"{np.median([r['D_named'] for r in rows]):+.3f})", art)
        v["contrastive_events_with_earlier_sibling"] = value(
            len(by_role[f"{c}:near_miss"]), "count of P2C events with earlier mentions of the near-miss", art)
    if len(heads.contrastive_readers) > 1:
        pair = "+".join(heads.contrastive_readers[:2])
        share, n_big = share_of_effect(by_role.get(f"{pair}:near_miss_line", []), floor)
        if share is not None:
            v["sibling_inventory_line_share"] = value(
                share, f"median D/E of the pair over {n_big} events with E above {floor}, the near-miss line blocked",
                art)
    if heads.region_readers and heads.region_readers[0] in beats:
        r0 = heads.region_readers[0]
        higher, n = beats[r0]
        v["notes_named_beat_control_p1"] = value(higher, f"count of {n} notes, {r0} named keys above control", art)
        v["chapter_events"] = value(len(by_role[f"{r0}:region"]), "count of P1 events", art)
    inputs = [out / "key_reads.json", *(out / n / "key_intervene.jsonl" for n in notes)]
    return v, inputs


def main() -> int:
    return run_reader("R-C10", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
