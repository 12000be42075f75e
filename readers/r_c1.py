"""R-C1 (Tables 6, 7): event counts and decision margins over the characterization traces.

Counts are exact given the stored traces (tolerance 0); margins vary within K.
"""

from __future__ import annotations

import numpy as np

from mistill.instrument.events import KINDS
from mistill.instrument.passes import artifact_state, load_events
from mistill.instrument.readout import instrument_dir, load_json, run_reader, value

READER = "readers/r_c1.py"


def keys(params: dict) -> list[str]:
    """Every key this reader can write (none depends on params)."""
    out = [f"{k.lower()}_event_count" for k in KINDS]
    out += ["p2c_events_with_earlier_code_mentions", "p2c_events_uncapped",
            "first_mentions_that_are_siblings_of_earlier"]
    for k in (k.lower() for k in KINDS):
        out += [f"notes_with_{k}_events", f"median_{k}_margin", f"p10_{k}_margin", f"p90_{k}_margin",
                f"median_{k}_entropy", f"share_{k}_margin_below_5", f"share_{k}_margin_below_0"]
    return out


def compute_values(params: dict) -> tuple[dict, list]:
    out = instrument_dir(params)
    summary = load_json(out / "events_summary.json")
    events = {k: [] for k in KINDS}
    notes_with = {k: 0 for k in KINDS}
    for note_dir in sorted(p for p in out.iterdir() if p.is_dir()):
        path = note_dir / "events.jsonl"
        if artifact_state(path, load_events) != "valid":
            continue
        note_events = load_events(path)
        for kind in KINDS:
            rows = [e for e in note_events if e.kind == kind]
            events[kind] += rows
            notes_with[kind] += bool(rows)
    art = out / "<note>/events.jsonl"
    v = {f"{k.lower()}_event_count": value(len(events[k]), "count", art) for k in KINDS}
    v["p2c_events_with_earlier_code_mentions"] = value(
        sum(bool(e.s_pos) for e in events["P2C"]), "count of P2C events with a non-empty S", art)
    extraction = summary.get("extraction", {})
    v["p2c_events_uncapped"] = value(extraction.get("p2c_uncapped", 0), "count before the cap of 2 per pair",
                                     out / "events_summary.json")
    if extraction.get("first_mentions"):
        v["first_mentions_that_are_siblings_of_earlier"] = value(
            100.0 * extraction["first_mentions_sibling_of_earlier"] / extraction["first_mentions"],
            "percent of first mentions", out / "events_summary.json")
    for kind in KINDS:
        margins = np.array([e.margin for e in events[kind] if e.margin is not None])
        entropies = np.array([e.entropy for e in events[kind] if e.entropy is not None])
        k = kind.lower()
        v[f"notes_with_{k}_events"] = value(notes_with[kind], "count of notes", art)
        if margins.size == 0:
            continue
        v[f"median_{k}_margin"] = value(float(np.median(margins)), f"nats, median over {kind} events", art)
        v[f"p10_{k}_margin"] = value(float(np.percentile(margins, 10)), "nats, 10th percentile", art)
        v[f"p90_{k}_margin"] = value(float(np.percentile(margins, 90)), "nats, 90th percentile", art)
        v[f"median_{k}_entropy"] = value(float(np.median(entropies)), "nats, median entropy over target and "
                                         "competitors", art)
        v[f"share_{k}_margin_below_5"] = value(float((margins < 5).mean()), "share of events", art)
        v[f"share_{k}_margin_below_0"] = value(float((margins < 0).mean()), "share of events", art)
    return v, [out / "events_summary.json"] + sorted(out.glob("*/events.jsonl"))


def main() -> int:
    return run_reader("R-C1", READER, __doc__.splitlines()[0], compute_values, keys)


if __name__ == "__main__":
    raise SystemExit(main())
