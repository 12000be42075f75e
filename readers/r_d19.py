"""R-D19 (Sec. 4.2, App. I.1, Table 38): which teacher events each student's tokenizer realises, and whether
the cross-family comparison depends on the events one tokenizer drops.

* Coverage (stage DT-coverage, `mistill distill coverage`): over the training notes' teacher targets, per
  event kind the teacher's events and the share each student's tokenizer realises as one decision
  (App. I.1: kept only where the model's next token begins at the event's anchor), and the per-note
  median share.
* Aligned subset: own-heads P2C knock-in recovery (top-k of each arm's re-ranked heads, the R-D6 cells)
  restricted to the contrastive events both students realise on a test note (the same event: its anchor
  in the trace and the sibling it departs from), Mistill minus Vanilla CoT-KD, seed-matched and
  note-clustered (`evaluate.compare.clustered`).
* The knock-in denominator: the share of P2C events above the 1-nat range gate, the teacher's (HD-002)
  and the range over the students' own-heads cells.

Reads <artifacts>/DT-coverage/coverage.json, the M6/<arm>-s<seed>/ cells (events.jsonl, patch2.jsonl) and
HD-002's faithfulness2.json; students: the first is Qwen3-4B's stand-in, the second SmolLM3-3B's.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from mistill.errors import UserError
from mistill.evaluate.compare import clustered, knockin_rows, note_recovery, seed_dirs
from mistill.evaluate.own_heads import OwnHeadsConfig
from mistill.evaluate.readout import main_for, value
from mistill.io import read_json, read_jsonl
from mistill.stats import StatsParams

READER = "readers/r_d19.py"
KINDS = ("P1", "P2", "P2C")
FAMILIES = ("qwen", "smollm")


def coverage_path(params: dict) -> Path:
    return Path(params["paths"]["artifacts"]) / "DT-coverage" / "coverage.json"


def keys(params: dict) -> list[str]:
    """Every key this reader can write under `params`."""
    out = [f"{f}_event_coverage_{k.lower()}" for f in FAMILIES for k in KINDS]
    out += [f"{f}_realized_events" for f in FAMILIES] + [f"{f}_per_note_coverage_median" for f in FAMILIES]
    out += ["smollm_aligned_subset_gain_vs_bf16", "smollm_aligned_subset_gain_vs_fp32", "qwen_aligned_subset_gain_vs_bf16",
            "qwen_aligned_subset_gain_vs_fp32", "aligned_p2c_events", "knockin_denominator_teacher_p2c",
            "knockin_denominator_students_p2c"]
    return out


def event_keys(m6_note: Path) -> list[tuple]:
    """(anchor, near miss) of each P2C knock-in row of one note, in row order: the rows follow the note's
    decision events, so the k-th P2C row is the k-th P2C event."""
    events = [e for e in read_jsonl(m6_note / "events.jsonl") if e.get("kind") == "P2C"]
    rows = [r for r in read_jsonl(m6_note / "patch2.jsonl") if r.get("kind") == "P2C"]
    if [e["pos"] for e in events] != [r["pos"] for r in rows]:
        raise UserError(f"{m6_note}: knock-in rows and events disagree on the P2C positions; rerun the own-heads chain")
    return [(e.get("anchor"), e.get("near_miss")) for e in events]


def _restricted(m6_dir: Path, common: dict[str, Counter]) -> dict[str, list[dict]]:
    """The arm's knock-in rows with its P2C rows kept only where the event is one both students realise."""
    out = {}
    for note, rows in knockin_rows(m6_dir).items():
        left = Counter(common.get(note, Counter()))
        keys_ = iter(event_keys(m6_dir / note))
        kept = []
        for r in rows:
            if r["kind"] != "P2C":
                continue
            key = next(keys_)
            if left[key] > 0:
                left[key] -= 1
                kept.append(r)
        out[note] = kept
    return out


def compute_values(params: dict) -> tuple[dict, list[Path]]:
    path = coverage_path(params)
    if not path.is_file():
        raise UserError(f"{path}: missing; run `dvc repro DT-coverage`")
    report = read_json(path, "event coverage")["coverage"]
    students = list(params["distill"]["students"])
    if len(students) != 2:
        raise UserError(f"params distill.students: R-D19 compares two students' tokenizers, got {students}")
    v: dict = {}
    for family, label in zip(FAMILIES, students):
        rep = report.get(f"student_{label}")
        if rep is None:
            raise UserError(f"{path}: no coverage for student_{label}; rerun DT-coverage")
        for k in KINDS:
            v[f"{family}_event_coverage_{k.lower()}"] = value(
                100.0 * rep[k]["share"], f"percent of the teacher's {rep[k]['teacher']} {k} events over "
                f"{rep['notes']} training notes realised by the student's tokenizer", path)
        teacher = sum(rep[k]["teacher"] for k in KINDS)
        v[f"{family}_realized_events"] = value(sum(rep[k]["realized"] for k in KINDS),
                                               f"count of {teacher} teacher events realised", path)
        v[f"{family}_per_note_coverage_median"] = value(rep["per_note_median_share"], "median over training notes of "
                                                        "the share of the note's teacher events realised", path)

    cfg = OwnHeadsConfig.from_params(params)
    labels = dict(params["evaluate"]["own_heads"].get("arms") or {})
    root, k = Path(cfg.artifacts), max(cfg.bins)
    stats = StatsParams.from_params(params)
    # the P2C events each student realises on each test note (its untrained cell: every arm sees the same traces)
    realised = []
    for family in FAMILIES:
        base = seed_dirs(root, labels[f"{family}_untrained"])
        m6 = next(iter(base.values()))
        realised.append({note: Counter(event_keys(m6 / note)) for note in knockin_rows(m6)})
    common = {note: realised[0][note] & realised[1][note] for note in set(realised[0]) & set(realised[1])}
    n_common = sum(sum(c.values()) for c in common.values())
    v["aligned_p2c_events"] = value(n_common, f"count of P2C events both students realise on {len(common)} test "
                                    "notes", f"{root}/M6")
    inputs: list[Path] = [path]
    for family in FAMILIES:
        for tag in ("bf16", "fp32"):
            arm, ref = labels.get(f"{family}_mistill"), labels.get(f"{family}_vanilla_{tag}")
            if arm is None or ref is None:
                continue
            values_by_arm = []
            for label in (arm, ref):
                dirs = seed_dirs(root, label)
                inputs += dirs.values()
                values_by_arm.append({seed: note_recovery(_restricted(d, common), phase="P2C", set_kind="top", k=k,
                                                          min_range=cfg.min_range) for seed, d in dirs.items()})
            c = clustered(*values_by_arm, stats)
            if c is None:
                continue
            v[f"{family}_aligned_subset_gain_vs_{tag}"] = value(
                c["mean_difference"], f"note-clustered mean over {c['n_notes']} test notes of the per-note mean "
                f"seed-pair difference, own top-{k} P2C recovery on the P2C events both students realise, Mistill "
                f"minus {tag} Vanilla CoT-KD; {c['notes_higher']} higher / {c['notes_lower']} lower",
                f"{root}/M6/{arm}-s* vs {root}/M6/{ref}-s*")

    teacher_faith = Path(params["evaluate"]["own_heads"].get("teacher_faithfulness") or "")
    if teacher_faith.is_file():
        rate = read_json(teacher_faith, "knock-in summary")["phases"]["P2C"]["range_gate_pass_rate"]
        v["knockin_denominator_teacher_p2c"] = value(rate, "share of the teacher's P2C events above the 1-nat range "
                                                     "gate, shortlist traces", teacher_faith)
        inputs.append(teacher_faith)
    rates = [read_json(d / "faithfulness2.json", "knock-in summary")["phases"]["P2C"]["range_gate_pass_rate"]
             for label in labels.values() for d in seed_dirs(root, label).values()]
    v["knockin_denominator_students_p2c"] = value([min(rates), max(rates)], "range over the students' own-heads "
                                                  "cells of the share of P2C events above the 1-nat range gate",
                                                  f"{root}/M6/*/faithfulness2.json")
    return v, inputs


if __name__ == "__main__":
    raise SystemExit(main_for("R-D19", READER, compute_values, keys))
